"""Client selection beyond uniform (``engine.selection``, docs/systems.md "Client selection").

A ``Selector`` picks each round's cohort from the candidates (the training pool, or with a
``system:`` section the clients online when the round starts) and learns from the clients that
trained: their losses and, on the simulated clock, their durations. Every random choice is a
pure function of (seed, round) (``raysim.sampling.selection_rng``) and of what the selector has
learned, which a checkpoint saves, so a resumed run picks what an uninterrupted one would.

The rooms: ``selector`` (the protocol, the feedback, the selector a job names), ``oort`` (Lai et
al., OSDI 2021), ``power_of_choice`` (Cho, Wang and Joshi, 2020: rpow-d).
"""
