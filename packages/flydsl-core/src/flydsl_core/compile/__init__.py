"""Compilation results independent of the backend: the ``ResourceReport`` (``resources.py``)."""
