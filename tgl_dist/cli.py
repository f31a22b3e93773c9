"""Command-line helpers shared by the package's CLIs and the example scripts."""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` text with each option's default, written once.

    Like :class:`argparse.ArgumentDefaultsHelpFormatter`, but adds ``(default: X)`` only
    when the help text does not already say what the default is, and not for defaults
    that mean "not given" (``None``, ``False``).
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False  # not 0, not 0.0
        if "default" in text.lower() or unset or action.default == argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)
