"""The package is publishable: a built wheel carries its licence, classifiers and project
URLs, and the repository keeps a changelog."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w",
                    str(out), str(ROOT)], check=True, capture_output=True, timeout=240)
    (built,) = out.glob("agentjournal-*.whl")
    return zipfile.ZipFile(built)


def metadata(wheel: zipfile.ZipFile) -> Message:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return Parser().parsestr(wheel.read(name).decode())


def test_the_wheel_ships_the_apache_licence_it_declares(wheel: zipfile.ZipFile) -> None:
    assert metadata(wheel)["License-Expression"] == "Apache-2.0"
    assert metadata(wheel).get_all("License-File") == ["LICENSE"]
    (licence,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    text = wheel.read(licence).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a stub


def test_the_wheel_has_classifiers_and_project_urls(wheel: zipfile.ZipFile) -> None:
    meta = metadata(wheel)
    classifiers = meta.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Typing :: Typed" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # the expression says it
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Repository", "Issues", "Changelog"} <= urls.keys()


def test_the_changelog_keeps_an_unreleased_section_and_each_release() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, re.M)
    assert headings[0] == "Unreleased"
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version in headings


def test_the_wheel_ships_the_viewer_with_htmx_vendored(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert {"agentjournal/ui/static/htmx.min.js", "agentjournal/ui/static/sse.min.js",
            "agentjournal/ui/static/ui.css", "agentjournal/ui/templates/base.html",
            "agentjournal/ui/templates/queue.html", "agentjournal/ui/templates/run.html"} <= names
    htmx = wheel.read("agentjournal/ui/static/htmx.min.js").decode()
    assert "htmx" in htmx and len(htmx) > 40_000  # the library itself, not a stub or a link
    for name in (n for n in names if n.startswith("agentjournal/ui/templates/")):
        assert "://" not in wheel.read(name).decode().replace("http://x", "")  # no CDN


def test_importing_agentjournal_imports_no_extra() -> None:
    """The viewer, tracing and metrics extras load only when asked for."""
    code = ("import sys, agentjournal, agentjournal.cli; "
            "print(sorted(m for m in ('starlette', 'uvicorn', 'jinja2', 'opentelemetry', "
            "'prometheus_client', 'playwright') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"


def test_importing_agentjournal_imports_no_framework() -> None:
    """The integrations are extras: the package and its CLI load without them."""
    code = ("import sys, agentjournal, agentjournal.cli, agentjournal.bridge, "
            "agentjournal.integrations; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'langgraph', 'langchain_core', 'pydantic_ai', 'agents', 'dbos', 'mcp'}))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    assert out.strip() == "[]"


def test_the_langgraph_extra_pins_the_versions_tested() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["langgraph"] == ["langgraph==1.2.24", "langgraph-checkpoint==4.3.2",
                                   "langgraph-prebuilt==1.1.3"]
    assert "langgraph==1.2.24" in extras["peers"]  # the bench's peer is the version tested
    assert "langgraph-checkpoint-conformance==0.0.2" in extras["dev"]


def test_the_pydantic_ai_extra_pins_the_framework(wheel: zipfile.ZipFile) -> None:
    required = metadata(wheel).get_all("Requires-Dist") or []
    pinned = [r for r in required if r.startswith("pydantic-ai-slim")
              and 'extra == "pydantic-ai"' in r]
    assert len(pinned) == 1 and "<3" in pinned[0] and ">=2.68" in pinned[0], required


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_the_openai_agents_session_imports_no_sdk() -> None:
    # The OpenAI Agents SDK takes seconds to import; its session class needs none of it.
    done = _python("import sys, agentjournal, agentjournal.integrations.openai_agents\n"
                   "print(sorted(m for m in ('agents', 'langgraph', 'pydantic_ai', "
                   "'temporalio') if m in sys.modules))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_openai_agents_extra_is_pinned_and_its_absence_explained() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert extras["openai-agents"] == ["openai-agents>=0.24,<0.25"]
    assert "openai-agents]" in extras["dev"][0]
    done = _python("import sys; sys.modules['agents'] = None\n"
                   "from agentjournal.integrations import openai_agents\n"
                   "try:\n    openai_agents.JournalRunner\n"
                   "except ImportError as exc:\n    print(exc)")
    assert done.returncode == 0, done.stderr
    assert "pip install 'agentjournal[openai-agents]'" in done.stdout
