"""``raysim track upload RUN_FOLDER``: sends what a run could not log to its MLflow store.

A run whose tracking store was unreachable or full when it ended saves the records the store did
not take in its folder (``tracking_unsent.jsonl``, see ``raysim.tracking.outbox``) and says which
command sends them. This is that command: it sends them, in order, to the same MLflow run, ends
that run with the status the run ended with, and notes each record sent, so that running it again
sends nothing twice (docs/tracking.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    track = sub.add_parser("track", help="MLflow records a run could not log: send them later")
    actions = track.add_subparsers(dest="action", required=True, metavar="ACTION")
    upload = actions.add_parser(
        "upload",
        help="send a run folder's unsent MLflow records to its run",
        description="Sends the records saved in RUN_FOLDER/tracking_unsent.jsonl (metrics, params, "
        "artifacts and the run's end that its tracking store did not take) to the same MLflow run, "
        "in the order they were logged. Each record sent is noted in the file; once all are, the "
        "file becomes tracking_uploaded.jsonl. Running it again sends nothing twice.",
    )
    upload.add_argument("run_folder", metavar="RUN_FOLDER", help="the run folder the run named")
    upload.add_argument(
        "--tracking-uri", help="the store to send to, if it moved (default: the one the run logged to)"
    )
    upload.set_defaults(handler=cmd_upload)


def cmd_upload(args: argparse.Namespace) -> int:
    from raysim.cli.console import console
    from raysim.tracking.outbox import UPLOADED_FILE, summary
    from raysim.tracking.unsent import claimed, read_unsent, upload

    folder = Path(args.run_folder)
    with claimed(folder):  # a second upload of the folder is refused: nothing goes twice
        unsent = read_unsent(folder)  # every line checked before anything is sent
        uri = args.tracking_uri or unsent.tracking_uri
        what = summary([record for _, record in unsent.records])
        num_sent = (
            upload(unsent, run_tracker(unsent.run_id, uri, unsent.path).deliver) if unsent.records else 0
        )
    done = f"sent {what} to MLflow run {unsent.run_id} in {uri}" if num_sent else "nothing left to send"
    console.print(f"{done}; noted in {folder / UPLOADED_FILE}", soft_wrap=True, highlight=False)
    return 0


def run_tracker(run_id: str, uri: str, path: Path) -> Any:
    """A tracker attached to the MLflow run ``path`` names, once the store (never made here)
    answers and holds the run.

    Raises:
        RaysimError: a URI raysim cannot use, a store that is missing or down, a run it lacks.
    """
    from mlflow.exceptions import MlflowException

    from raysim.engine.preflight import check_existing_tracking_store
    from raysim.errors import ResourceError
    from raysim.tracking.tracker import MlflowTracker

    hint = "pass --tracking-uri to the store the run logged to"
    check_existing_tracking_store(uri, hint)
    tracker = MlflowTracker.attach(run_id, uri)
    try:
        tracker.client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise ResourceError(f"{path} names MLflow run {run_id}, which {uri} does not hold; {hint}") from None
    return tracker
