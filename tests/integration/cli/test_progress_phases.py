"""The progress display follows a run through its phases, in order."""

from jobs import tiny_job
from raysim.engine import loop
from raysim.engine.progress import RoundProgress


def _phases(monkeypatch) -> list[str]:
    seen: list[str] = []
    original = RoundProgress.phase

    def record(self: RoundProgress, name: str) -> None:
        if not seen or seen[-1] != name:
            seen.append(name)
        original(self, name)

    monkeypatch.setattr(RoundProgress, "phase", record)
    return seen


def test_evaluation_rounds_show_as_evaluating(tmp_path, monkeypatch):
    seen = _phases(monkeypatch)
    loop.run(tiny_job(engine={"num_rounds": 3}, evaluation={"every": 2}), output_dir=tmp_path)
    assert seen == ["training", "evaluating", "training", "evaluating", "finishing"]


def test_personalization_shows_as_personalizing(tmp_path, monkeypatch):
    seen = _phases(monkeypatch)
    job = tiny_job(
        engine={"num_rounds": 2},
        evaluation={"every": 2, "heldout_fraction": 0.25, "personalization": {"epochs": 1}},
    )
    loop.run(job, output_dir=tmp_path)
    # round 0 trains only; round 1 (the last) evaluates and personalizes; then the final artifacts
    assert seen == ["training", "personalizing", "finishing"]


def test_a_one_shot_method_moves_the_bar_by_its_steps(tmp_path, monkeypatch):
    seen: list[tuple[str, float | None, float]] = []
    original = RoundProgress.__exit__

    def record(self: RoundProgress, *exc: object) -> None:
        task = self.progress.tasks[0]
        seen.append((str(task.fields["rounds"]), task.total, task.completed))
        original(self, *exc)

    monkeypatch.setattr(RoundProgress, "__exit__", record)
    monkeypatch.setenv("RAYSIM_HOME", str(tmp_path))  # its client models' cache: not the checkout's
    loop.run(tiny_job(algorithm={"name": "oneshot_fedavg"}), output_dir=tmp_path)
    assert seen == [("step 0", 1, 1)]  # unfixed: "0/3", nothing completed
