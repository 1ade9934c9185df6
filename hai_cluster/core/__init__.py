"""Pure shared vocabulary and rules: job specs and views, job scripts, fits, states, sharing
accounting, time and id formats."""
