"""Processes on this host: one live writer per directory (``runlock``), liveness of a pid
(``pids``), child processes that survive the terminal (``childproc``)."""
