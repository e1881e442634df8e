"""mkdocs hook: pages of the site that show a file at the repository's root.

``docs/contributing.md`` is, in the repository, a pointer to ``CONTRIBUTING.md`` (what a reader browsing
``docs/`` on GitHub needs); the built site replaces it with ``CONTRIBUTING.md`` itself, so the guide has one
source and the page never shows an include directive.
"""

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"contributing.md": "CONTRIBUTING.md"}


def on_files(files, config, **kwargs):
    for page, source in PAGES.items():
        pointer = files.get_file_from_path(page)
        if pointer is not None:
            files.remove(pointer)
        files.append(File.generated(config, page, content=(ROOT / source).read_text(encoding="utf-8")))
    return files
