"""The run's life and its faults: what keeps a run whole (`guard`: backup, preemption, watchdog, Ctrl-C, early
stopping as the controller's actions) and what a resumed run keeps (`backup`, `resume`)."""
