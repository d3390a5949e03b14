"""Client availability, device speed, stragglers and a simulated clock (docs/systems.md).

A job's ``system:`` section turns the round into a timed event on a simulated clock. Every
decision is made on the driver from the simulated times, before any training, so a client that
is dropped costs no compute; and every random draw is a pure function of (seed, round, client)
with its own purpose tag, as in ``raysim.sampling``, so a job gives the same cohorts and drops on
any backend, and a resumed run replays the clock without training.

The model of a round (FedScale: Lai et al., ICML 2022, arXiv:2105.11367: availability and device
traces, over-commitment; over-selection and reporting deadlines: Bonawitz et al., SysML 2019,
arXiv:1902.01046):

1. The round starts at the clock's time, or, when no training client is available then, at the
   first moment one is. ``ceil(over_commit * cohort_size)`` of the available clients are drawn.
2. A client's completion time is ``download + compute + upload``: the model's bytes over its
   bandwidth twice, and the examples its local training visits over its speed (examples/s).
3. It fails when it drops out (probability ``dropout``), goes offline before it is done (its
   availability interval ends), or is not done by ``deadline_s``. FedProx's stragglers (Li et
   al., MLSys 2020, arXiv:1812.06127, sec. 5) can do only a random number of epochs in
   ``[1, E]`` this round. With ``partial_work`` a client that cannot do its full local work in
   time does the local steps that fit (at least one) instead of failing: FedProx's variable local
   work (its gamma-inexact solutions); without it, it is dropped as FedAvg drops stragglers.
4. The first ``cohort_size`` clients to report are aggregated (over-commitment keeps the fastest);
   the round ends at the ``cohort_size``-th report, or, when fewer report, once every drawn client
   has reported or been noticed failing (at the time its report was due), never after the deadline.

The rooms: ``config`` (the job's ``system:`` section), ``availability`` and ``devices`` (the
fleet), ``work`` (the batches of local work), ``rounds`` (the simulated clock), ``traces``
(trace files).

Usage:
    system = SimulatedSystem(config, fleet, work, pool, cohort_size=10, model_bytes=4e5, seed=0)
    plan = system.round(0); plan.cohort, plan.step_budgets, plan.end_s
"""
