"""Process start-up and shutdown, imported only by the CLI (and the load harness): logging
(``logs``), uvloop and GC tuning (``process``), the database and its start-up waits
(``database``, ``startup``; ``embedded`` when no DSN is given), the long-running commands
(``serve``), ``gateway serve``'s worker processes (``workers``) and the background services
(``services``)."""
