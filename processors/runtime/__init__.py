"""The worker: everything that imports Faust or aiokafka. `app` builds the Faust app and
registers the jobs of `jobs.WorkerJobs`; `faust_adaptations` is every change made to
Faust (docs/faust-adaptations.md); `worker` runs it from the command line."""
