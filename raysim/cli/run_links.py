"""MLflow UI links printed for the user: after ``raysim run`` (each run, its charts, the compare
view) and when ``raysim ui`` or ``raysim server`` answers (the newest experiment's charts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from raysim.cli.console import console

if TYPE_CHECKING:
    from rich.console import Console


def print_experiment_links(base: str, experiment: dict | None) -> None:
    from raysim.tracking.links import chart_link

    if experiment is not None:
        console.print(
            f"Newest experiment {experiment['name']!r}, its runs as charts: "
            f"{chart_link(base, experiment['experiment_id'])}",
            soft_wrap=True,
            highlight=False,
        )


def print_run_links(out: Console, uri: str, run_ids: list[str]) -> None:
    """After ``raysim run``: each run's page (labelled with its MLflow run name), its
    experiment's runs as charts and, for several runs, MLflow's compare view of them."""
    from mlflow.tracking import MlflowClient

    from raysim.tracking.links import chart_link, compare_link, run_link, ui_base
    from raysim.tracking.tracking_store import is_server

    client = MlflowClient(tracking_uri=uri)
    infos = [client.get_run(run_id).info for run_id in run_ids]
    experiment_of = {info.run_id: info.experiment_id for info in infos}
    base = ui_base(uri)
    if not is_server(uri):
        out.print(
            f"Open them while [bold]raysim ui[/] runs (it serves this store on {base}):", soft_wrap=True
        )
    rows = [(f"run {info.run_name}", run_link(base, info.experiment_id, info.run_id)) for info in infos]
    rows += [("charts", chart_link(base, e)) for e in dict.fromkeys(experiment_of.values())]
    if len(infos) > 1:
        rows.append(("compare", compare_link(base, experiment_of, experiment_of.values())))
    width = max(len(label) for label, _ in rows)
    for label, link in rows:  # one link a line, never wrapped: terminals make it clickable
        out.print(f"  {label:<{width}}  {link}", soft_wrap=True, highlight=False, markup=False)
