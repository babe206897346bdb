"""Parts every stage shares, in the flow process and in the child jobs, in rooms by concern, each importing only those below it: config, tracking, stores, reports, measures, process, runtimes."""
