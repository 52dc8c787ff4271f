"""cdc2ch's own tables in each target database: offsets, claims, requests, compactions."""
