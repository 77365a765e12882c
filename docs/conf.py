"""Sphinx configuration of the mpiredist documentation.

Build: ``sphinx-build -W --keep-going -b html docs docs/_build/html`` (as
scripts/docs_ci.sh does).  At build start (``builder-inited``) two things are
written, neither committed (docs/.gitignore):

- ``api/generated/<name>.rst``: one page per name of ``mpiredist.__all__``
  (autodoc), so a name added to ``__all__`` appears by itself;
- ``_generated/*.png``: the pictures of the guide (``docs/pictures.py``:
  ``plan --draw`` of a few plans, ``bench --plot`` of the recorded run in
  ``docs/_data/``).

Markdown pages are read by MyST; docstrings are numpydoc-style, turned into
reST by ``sphinx.ext.napoleon``.
"""

import inspect
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)                              # pictures.py
sys.path.insert(0, os.path.dirname(HERE))             # the checkout's mpiredist

import mpiredist  # noqa: E402

project = "mpiredist"
author = "the mpiredist developers"
copyright = "2026, the mpiredist developers"
version = release = mpiredist.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "README.md"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

autodoc_default_options = {"members": True, "member-order": "bysource",
                           "show-inheritance": True}
autodoc_typehints = "none"
autodoc_mock_imports = []
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

html_theme = "pydata_sphinx_theme"
html_title = f"mpiredist {release}"
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_show_sourcelink = False


def _kind(obj):
    if inspect.ismodule(obj):
        return "module"
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return "exception"
    if isinstance(obj, type):
        return "class"
    return "function"


DIRECTIVES = {"module": "automodule", "exception": "autoexception", "class": "autoclass",
              "function": "autofunction"}

SECTIONS = (("class", "Classes"), ("function", "Functions"), ("module", "Modules"),
            ("exception", "Errors and warnings"))


def write_api_pages(app):
    """One page per public name (``mpiredist.__all__``) and their index."""
    out = os.path.join(app.srcdir, "api", "generated")
    os.makedirs(out, exist_ok=True)
    kinds = {}
    for name in mpiredist.__all__:
        obj = getattr(mpiredist, name)
        kind = _kind(obj)
        kinds.setdefault(kind, []).append(name)
        target = obj.__name__ if kind == "module" else f"mpiredist.{name}"
        title = f"mpiredist.{name}"
        lines = [title, "=" * len(title), ""]
        shared = _shared_members(obj) if kind == "module" else {}
        if kind == "module":
            lines += [f"``mpiredist.{name}`` is the module ``{obj.__name__}``.", ""]
        if shared:
            lines += ["Documented under their top-level names: " + ", ".join(
                f":obj:`{name}.{m} <mpiredist.{top}>`" for m, top in shared.items()) + ".", ""]
        lines += [f".. {DIRECTIVES[kind]}:: {target}"]
        if kind == "class":
            lines += ["   :special-members: __call__, __enter__, __exit__"]
        if shared:
            lines += ["   :exclude-members: " + ", ".join(shared)]
        _write(os.path.join(out, f"{name}.rst"), "\n".join(lines) + "\n")
    index = ["API reference", "=============", "",
             "Every public name of ``mpiredist`` (its ``__all__``), from the docstrings.",
             "Use them as ``import mpiredist as mr; mr.Transfer(...)``.", ""]
    for kind, heading in SECTIONS:
        names = kinds.get(kind, [])
        if not names:
            continue
        index += [heading, "-" * len(heading), "", ".. toctree::", "   :maxdepth: 1", ""]
        index += [f"   {n}" for n in names] + [""]
    _write(os.path.join(app.srcdir, "api", "generated", "index.rst"), "\n".join(index))
    stale = {f[:-4] for f in os.listdir(out) if f.endswith(".rst")} - set(mpiredist.__all__)
    for name in stale - {"index"}:
        os.remove(os.path.join(out, f"{name}.rst"))


def _shared_members(module):
    """A public module's members that are also top-level names: {member: name}.

    ``mr.checkpoint.save`` is ``mr.save``: documented once, on the top-level
    page, so that every object has one anchor (viewcode's source links point
    at one place, and no page links to an id another page holds).
    """
    top = {id(getattr(mpiredist, n)): n for n in mpiredist.__all__}
    return {m: top[id(getattr(module, m))] for m in getattr(module, "__all__", ())
            if id(getattr(module, m, None)) in top}


def _write(path, text):
    """Write only on change, so that Sphinx rebuilds only what changed."""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_pictures(app):
    import pictures
    pictures.write_all(os.path.join(app.srcdir, "_generated"))


# numpydoc sections whose entries are "name : type" lines
_ENTRY_SECTIONS = ("Parameters", "Other Parameters", "Attributes", "Returns", "Yields",
                   "Raises", "Warns", "Receives")
_ENTRY = re.compile(r"^\*{0,2}[\w.]+(\s*,\s*\*{0,2}[\w.]+)*\s*(:.*)?$")


def notes_after_entries(app, what, name, obj, options, lines):
    """Give text that follows a numpydoc entry section unheaded a ``Notes`` heading.

    A docstring that goes on with a paragraph after its ``Parameters`` (say),
    at the section's indentation and without a heading of its own, would be
    read by napoleon as more parameters.  Runs before napoleon (priority
    400); a line that looks like an entry (``name`` or ``name : type``) is
    left alone.
    """
    out, section, blank = [], None, False
    for i, line in enumerate(lines):
        heading = i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"} and line.strip()
        if heading:
            section = line.strip()
        elif (section in _ENTRY_SECTIONS and blank and line and not line[0].isspace()
              and not _ENTRY.match(line.strip()) and not set(line.strip()) <= {"-"}):
            out += ["Notes", "-----"]
            section = "Notes"
        blank = not line.strip()
        out.append(line)
    lines[:] = out


def setup(app):
    app.connect("autodoc-process-docstring", notes_after_entries, priority=400)
    app.connect("builder-inited", write_api_pages)
    app.connect("builder-inited", write_pictures)
