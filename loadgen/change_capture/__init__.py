"""What recording a view's changes costs per changed group, beside its floor (`python -m loadgen.change_capture`)."""
