"""How a pipeline begins: inputs checked, its initial load chosen, its first offset, or where it resumes."""
