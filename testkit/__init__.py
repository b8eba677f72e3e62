"""The testing harness shared by tests/ and bench/: ports, processes, clusters, models, clocks."""
