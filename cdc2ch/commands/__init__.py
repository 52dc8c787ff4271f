"""What each command does once its options are parsed, and the options of every command."""
