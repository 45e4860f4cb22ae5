"""Scenarios. Each module offers ``cases(profile)``: the selectable units one deployment runs."""
