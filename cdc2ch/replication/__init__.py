"""One pipeline: the ports it drives, the poll/commit loop and its decisions, the writers and the snapshot load."""
