"""What the code cites is in the repository: no docstring or comment under harness/ points into ../shared (a folder
a clone does not have), and every `docs/<name>.md` it names exists (issue 19, item 5)."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
CITED_DOC = re.compile(r"docs/([\w.-]+\.md)")
# `## Section` headings cited as (docs/X.md, "Section")
CITED_SECTION = re.compile(r'docs/([\w.-]+\.md), "([^"]+)"')


def _sources():
    return sorted((ROOT / "harness").rglob("*.py"))


def test_no_file_under_harness_cites_the_shared_folder():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in _sources()
             for n, line in enumerate(path.read_text().splitlines(), 1) if "shared/" in line]
    assert found == []


def test_every_cited_doc_and_section_exists():
    cited = {}
    for path in _sources():
        text = path.read_text()
        for name in CITED_DOC.findall(text):
            cited.setdefault(name, []).append(path.relative_to(ROOT))
        for name, section in CITED_SECTION.findall(text):
            doc = ROOT / "docs" / name
            headings = [line.lstrip("#").strip() for line in doc.read_text().splitlines() if line.startswith("#")]
            assert any(h.startswith(section) for h in headings), (path, name, section, headings)
    assert "GEE_FORMAT.md" in cited, cited  # the format reference is cited from the repository
    missing = {name: where for name, where in cited.items() if not (ROOT / "docs" / name).is_file()}
    assert missing == {}


def test_readme_security_table_is_the_port_inventory():
    """The README's table of listening sockets is `harness.ports.markdown_table()`, as is (issue 24, item 1)."""
    from harness import ports

    assert ports.markdown_table() in (ROOT / "docs" / "security.md").read_text()


def test_every_relative_link_of_the_readme_and_docs_resolves():
    """README.md and docs/*.md link each other, the examples and the tests by relative paths: each must exist."""
    import re

    broken = [(page.name, target) for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
              for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text())
              if not target.startswith(("http://", "https://", "#", "mailto:"))
              and not (page.parent / target.split("#")[0]).exists()]
    assert broken == []
