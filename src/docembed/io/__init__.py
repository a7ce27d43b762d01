"""Reading documents and reading/writing embeddings."""
