"""The user commands (hsubmit, hqueue, hcancel, hcontrol, hacct, hinfo, hstat, hshare): thin
clients of the controller's API."""
