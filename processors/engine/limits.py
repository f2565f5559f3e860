"""How large one run may grow: a stream processor holds every open run in memory (and
its changelog), so a run that streams without end, or a gigabyte of deltas, must
end before it ends the worker (rule book section 3, *Limits*).

Counted by the engine for the active run: records applied, characters of streamed
text and tool-call arguments held, and items held (messages and tool calls, with
open spans, steps and subagents). The first record past a limit fails the run
with the limit's code, like any failure: its encrypted values count as lost, its
state is freed, the rest of the run is discarded. Counts start anew when a
worker loads the key's state again (a restart): the content held is counted
from what was restored, the records from zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class RunLimits:
    events: int  # records applied to one run
    content_chars: int  # characters of streamed text and arguments one run holds
    items: int  # messages, tool calls and open spans, steps and subagents of one run;
    # also the messages a key's index remembers from its earlier runs


# Far above any run an agent produces, far below what exhausts a worker: a run at the
# content limit holds about 32 MB of text (about two bytes held per character).
DEFAULT_LIMITS: Final = RunLimits(events=1_000_000, content_chars=16_000_000, items=10_000)
