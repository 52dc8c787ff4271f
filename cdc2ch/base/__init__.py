"""Plumbing every layer uses: errors a user can meet, logging, the one retry policy."""
