"""From a command line to configurations: every option declared once (catalogue), resolved with the config
file and the environment into frozen configurations (options) and the pipelines an invocation names
(listing). The reference pages of the documentation are made from the same declarations (docs/hooks/reference.py)."""
