"""State changes of the run lifecycle, as named actions, one module per topic: campaigns, runs, workers, fits,
detector records and detector versions. Each takes the acting user (None: the system); permissions are checked by
the callers, at the edge."""
