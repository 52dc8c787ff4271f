"""`python -m cdc2ch`: the command line."""

from cdc2ch.cli import main

main()
