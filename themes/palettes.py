"""tapdeck's themes as plain data (no Textual import): the app turns each into a `textual.theme.Theme`.

Besides Textual's standard colours each theme sets tapdeck's own variables, used by the stylesheet and
by token colouring (`$logprob-*`), so switching the theme recolours tokens too.
"""

from __future__ import annotations

# Variables every theme must define (also the defaults for Textual's built-in themes).
VARIABLE_DEFAULTS: dict[str, str] = {
    "logprob-mid": "#6b5a1e",
    "logprob-low": "#9a5518",
    "logprob-vlow": "#b0203a",
    "logprob-masked": "#7a8290",
    "idle": "#d08a20",
}

THEMES: dict[str, dict] = {
    "tapdeck-dark": {
        "primary": "#4EA1FF",
        "secondary": "#A48CF2",
        "accent": "#FFB454",
        "warning": "#E6C07B",
        "error": "#F0506E",
        "success": "#7FD962",
        "foreground": "#D8DEE9",
        "background": "#10141A",
        "surface": "#171C24",
        "panel": "#222A36",
        "dark": True,
        "variables": {
            "logprob-mid": "#5a4c14",
            "logprob-low": "#8c4a0c",
            "logprob-vlow": "#a3172f",
            "logprob-masked": "#6d7583",
            "idle": "#FFB454",
            "footer-key-foreground": "#4EA1FF",
        },
    },
    "tapdeck-light": {
        "primary": "#0B5CAD",
        "secondary": "#6A4BC4",
        "accent": "#B35900",
        "warning": "#8A6100",
        "error": "#C0223F",
        "success": "#2E7D32",
        "foreground": "#1E2430",
        "background": "#F7F8FA",
        "surface": "#FFFFFF",
        "panel": "#E3E7EE",
        "dark": False,
        "variables": {
            "logprob-mid": "#F6E7A8",
            "logprob-low": "#F6C28B",
            "logprob-vlow": "#F08A9B",
            "logprob-masked": "#8A93A3",
            "idle": "#B35900",
            "footer-key-foreground": "#0B5CAD",
        },
    },
}

DEFAULT_THEME = "tapdeck-dark"
