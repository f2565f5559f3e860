"""The worker's Faust app keeps queued records when flow resumes while active."""

from __future__ import annotations

from processors.config import Settings
from processors.service import faust_app


def test_resume_while_active_keeps_queued_records_and_after_suspension_clears() -> None:
    app = faust_app(Settings.from_env({}))
    # A queue managed like the agents' stream queues and the changelog queue.
    queue = app.FlowControlQueue(maxsize=10, clear_on_resume=True)
    app.flow_control.resume()  # the app starts suspended
    queue.put_nowait("record fetched after the input partitions resumed")
    app.flow_control.resume()  # what Faust does again when table recovery completes
    assert queue.qsize() == 1 and app.flow_control.is_active()
    app.flow_control.suspend()  # a rebalance
    app.flow_control.resume()
    assert queue.qsize() == 0  # what was queued before the suspension is discarded
