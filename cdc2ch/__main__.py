from cdc2ch.cli import main

main()
