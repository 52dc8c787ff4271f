"""From a command line to configurations: every option declared once (catalogue), resolved with the config
file and the environment into frozen configurations (options), the pipelines an invocation names (listing),
and the README table made from the declarations (optiontable)."""
