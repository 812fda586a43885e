"""The course: experiments, teaching helpers, views, the cost ledger, the noodle-shop corpus and
the baselines the chapters compare against.  It imports the engine; the engine never imports it.

Its plotting and dataframe libraries are an extra: `pip install "minilm-engine[course]"`.
"""

from __future__ import annotations

import importlib.util

# What the course needs beyond the engine, and the package that brings each.
COURSE_DEPENDENCIES = {"pandas": "pandas", "plotly": "plotly", "matplotlib": "matplotlib", "ipywidgets": "ipywidgets"}


def missing_dependencies() -> list[str]:
    """The course's extra packages that are not installed."""
    return [pkg for module, pkg in COURSE_DEPENDENCIES.items() if importlib.util.find_spec(module) is None]


def require_course_dependencies() -> None:
    """Raise a one-line install hint when the course's extra is missing."""
    missing = missing_dependencies()
    if missing:
        raise ImportError(
            f"minilm_engine.course needs {', '.join(missing)}: pip install \"minilm-engine[course]\""
        )


require_course_dependencies()
