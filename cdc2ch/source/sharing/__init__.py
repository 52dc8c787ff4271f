"""Tables shared through Delta Sharing: the REST client, its answers and files, the source."""
