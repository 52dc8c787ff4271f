"""One pipeline: the ports it drives, the poll/commit loop and its decisions, a pipeline's standing and a
range's steps, how it begins (`startup`), and whole-table loads (`fullload`); `target` builds its ports on a
ClickHouse target."""
