"""One pipeline: the ports it drives, the poll/commit loop and its decisions, how it begins (`startup`), the
writers, and whole-table loads (`fullload`)."""
