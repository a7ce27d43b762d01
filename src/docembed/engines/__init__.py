"""Execution engines for `docembed encode` besides the in-process one (docembed.encoding)."""
