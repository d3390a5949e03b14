"""The command line's own errors: each shows the usage of the command it is about."""

import pytest

from raysim.cli.main import main


@pytest.mark.parametrize(
    ("argv", "usage", "says"),
    [
        (["ls", "--bogus"], "usage: raysim ls ", "raysim ls: error: unrecognized arguments: --bogus"),
        (["runs", "--bogus"], "usage: raysim runs ", "raysim runs: error: unrecognized arguments: --bogus"),
        (  # an override after the options, as one before them is told
            ["run", "jobs/quickstart.yaml", "--dry-run", "engine.num_rounds=2", "badtoken"],
            "usage: raysim run ",
            "raysim run: error: override 'badtoken': expected key.sub=value",
        ),
        (["ui", "x=1"], "usage: raysim ui ", "raysim ui: error: ui takes no key=value overrides: x=1"),
    ],
)
def test_an_argument_a_command_does_not_take_shows_that_commands_usage(argv, usage, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(usage) and says in err, err  # not raysim's own usage
