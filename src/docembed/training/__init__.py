"""One training loop (loop.py) and one recipe per method (what data it reads, how it batches, which loss)."""
