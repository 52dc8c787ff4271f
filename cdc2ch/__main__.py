"""`python -m cdc2ch` and the `cdc2ch` command: stop signals are caught before the command line is
imported, so that one sent to a service still starting is a clean stop, not a traceback."""

from cdc2ch.base import stop


def main() -> None:
    stop.catch_early()
    from cdc2ch.cli import main as command_line

    command_line()


if __name__ == "__main__":
    main()
