"""Native parts: the C hsubmit (hsubmit.c) and its build (build.py)."""
