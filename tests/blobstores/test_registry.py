"""The plugin registry: built-in schemes, third-party entry points, errors, and options.

Third-party plugins are real: each test writes a ``.dist-info`` directory (METADATA,
entry_points.txt) next to the plugin's module in ``tmp_path`` and puts that directory on
``sys.path``, so ``importlib.metadata`` discovers it exactly as it would an installed
distribution.  The demo plugin is the one in ``tests/plugin_pkg`` (its module and its
pyproject metadata), which ``test_packaging.py`` installs with pip.
"""

from __future__ import annotations

import sys
import tomllib
import uuid
from importlib.metadata import version as dist_version
from pathlib import Path

import pytest

import shardstore
import shardstore.blobstores as bs
from shardstore.blobstores import ConfigError, open_backend, open_store, plugin_class, plugins, registry, schemes
from shardstore.blobstores.options import Option, coerce_options
from shardstore.plugins.local import LocalStore
from shardstore.plugins.memory import MemoryStore

#: scheme -> entry-point target, as declared in shardstore's pyproject.toml.
BUILTINS = {
    "memory": "shardstore.plugins.memory:MemoryStore",
    "file": "shardstore.plugins.local:LocalStore",
    "s3": "shardstore.plugins.s3:S3Store",
    "oci": "shardstore.plugins.oci:OCIStore",
    "gs": "shardstore.plugins.gcs:GCSStore",
    "az": "shardstore.plugins.azure:AzureStore",
}

PLUGIN_PKG = Path(__file__).parent.parent / "plugin_pkg"
DEMO_MODULE = "shardstore_demo_plugin"


# --------------------------------------------------------------------------- helpers


def make_dist(
    site: Path,
    name: str,
    version: str,
    entry_points: dict[str, str],
    modules: dict[str, str],
) -> Path:
    """Write an installed-distribution layout under ``site``: modules plus ``.dist-info``."""
    site.mkdir(parents=True, exist_ok=True)
    for mod, source in modules.items():
        (site / f"{mod}.py").write_text(source)
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = ["[shardstore.blobstores]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return site


@pytest.fixture
def on_path(monkeypatch):
    """Put a directory on sys.path (importable and visible to importlib.metadata).

    Modules imported from it are forgotten afterwards so other tests do not see them.
    """
    added: list[str] = []

    def add(site: Path, *module_names: str) -> None:
        monkeypatch.syspath_prepend(str(site))
        added.extend(module_names)

    yield add
    for mod in added:
        sys.modules.pop(mod, None)


@pytest.fixture
def demo_dist(tmp_path, on_path):
    """The demo plugin of tests/plugin_pkg, 'installed' as a .dist-info in tmp_path."""
    meta = tomllib.loads((PLUGIN_PKG / "pyproject.toml").read_text())["project"]
    site = make_dist(
        tmp_path / "site",
        meta["name"],
        meta["version"],
        meta["entry-points"]["shardstore.blobstores"],
        {DEMO_MODULE: (PLUGIN_PKG / "src" / f"{DEMO_MODULE}.py").read_text()},
    )
    on_path(site, DEMO_MODULE)
    return meta


@pytest.fixture
def space():
    """A fresh memory-space name (memory spaces are process-wide, keyed by bucket)."""
    name = f"reg-{uuid.uuid4().hex}"
    yield name
    MemoryStore.drop(name)


# --------------------------------------------------------------------------- (a) built-ins


def test_builtin_schemes_are_listed():
    assert set(BUILTINS) <= set(schemes())
    assert schemes() == sorted(schemes())


def test_builtin_plugins_name_shardstore_and_its_version():
    installed = dist_version("shardstore")
    assert shardstore.__version__ == installed
    by_scheme = {p.scheme: p for p in plugins()}
    for scheme, target in BUILTINS.items():
        info = by_scheme[scheme]
        assert info == bs.PluginInfo(scheme, target, "shardstore", installed)


def test_builtin_classes_load_for_the_core_backends():
    assert plugin_class("memory") is MemoryStore
    assert plugin_class("file") is LocalStore
    assert plugin_class("MEMORY") is MemoryStore  # schemes are case-insensitive


def test_open_store_builtin_roundtrip(space):
    store = open_store(f"memory://{space}/p")
    store.put("k", b"v", if_absent=True)
    assert store.get("k") == b"v"
    assert isinstance(store.inner, MemoryStore)


# --------------------------------------------------------------------------- (b) third party


def test_third_party_scheme_from_dist_info(demo_dist, space):
    assert "demo" in schemes()
    store = open_store(f"demo://{space}/root")
    assert store.scheme == "demo"
    assert store.location == f"demo://{space}/root"
    info = store.put("a/b", b"payload", if_absent=True)
    assert info.size == 7
    assert store.get("a/b") == b"payload"
    assert [i.key for i in store.list("a/")] == ["a/b"]
    with pytest.raises(bs.BlobAlreadyExists):
        store.put("a/b", b"other", if_absent=True)


def test_third_party_class_is_the_plugins_own(demo_dist, space):
    cls = plugin_class("demo")
    assert cls.__module__ == DEMO_MODULE
    assert cls.__name__ == "DemoStore"
    assert issubclass(cls, MemoryStore) and cls is not MemoryStore
    backend = open_backend(f"demo://{space}?page_size=3")
    assert type(backend) is cls
    assert backend.options["page_size"] == 3  # inherited option table, coerced from the query
    # The subclass still serves only its own scheme.
    with pytest.raises(ConfigError, match="demo://"):
        cls(f"memory://{space}")


def test_third_party_listed_with_its_package_and_version(demo_dist):
    by_scheme = {p.scheme: p for p in plugins()}
    demo = by_scheme["demo"]
    assert demo.target == demo_dist["entry-points"]["shardstore.blobstores"]["demo"]
    assert demo.package == demo_dist["name"] == "shardstore-demo-plugin"
    assert demo.version == demo_dist["version"] == "1.2.3"
    # Adding a plugin leaves the built-ins as they were.
    for scheme in BUILTINS:
        assert by_scheme[scheme].package == "shardstore"


def test_third_party_is_not_imported_until_opened(tmp_path, on_path):
    # A module that records its own import: listing must not import it.
    marker = tmp_path / "imported"
    site = make_dist(
        tmp_path / "site",
        "lazy-plugin",
        "0.0.1",
        {"lazy": "lazy_plugin_mod:LazyStore"},
        {
            "lazy_plugin_mod": (
                "import pathlib\n"
                f"pathlib.Path({str(marker)!r}).write_text('x')\n"
                "from shardstore.plugins.memory import MemoryStore\n"
                "class LazyStore(MemoryStore):\n"
                "    scheme = 'lazy'\n"
            )
        },
    )
    on_path(site, "lazy_plugin_mod")
    assert "lazy" in schemes()
    assert "lazy" in {p.scheme for p in plugins()}
    assert not marker.exists()
    assert plugin_class("lazy").scheme == "lazy"
    assert marker.exists()


def test_two_distributions_claiming_a_scheme_is_a_clear_error(tmp_path, on_path, space):
    # Documented rule (registry module docstring): which of two claims would win depends on
    # directory listing order, so opening the scheme refuses and names both distributions.
    site = make_dist(
        tmp_path / "site",
        "memory-override",
        "9.9.9",
        {"memory": "memory_override_mod:Override"},
        {
            "memory_override_mod": (
                "from shardstore.plugins.memory import MemoryStore\n"
                "class Override(MemoryStore):\n"
                "    pass\n"
            )
        },
    )
    on_path(site, "memory_override_mod")
    with pytest.raises(ConfigError, match="claimed by several distributions") as err:
        plugin_class("memory")
    assert "memory-override" in str(err.value) and "shardstore" in str(err.value)
    info = {p.scheme: p for p in plugins()}["memory"]
    assert len(info.conflicts) == 1
    assert plugin_class("file").__name__ == "LocalStore"  # other schemes are unaffected


# --------------------------------------------------------------------------- (b2) scan cache


def _cached_plugin_source(mod: str, scheme: str) -> dict[str, str]:
    return {
        mod: (
            "from shardstore.plugins.memory import MemoryStore\n"
            "class CachedStore(MemoryStore):\n"
            f"    scheme = {scheme!r}\n"
        )
    }


def test_scan_is_cached_for_an_unchanged_sys_path(monkeypatch):
    schemes()  # the scan for the current sys.path is cached now
    calls = []
    real = registry.entry_points
    monkeypatch.setattr(registry, "entry_points", lambda **kw: calls.append(kw) or real(**kw))
    for _ in range(3):
        assert plugin_class("memory") is MemoryStore
        assert "file" in schemes()
    assert calls == []


def test_dist_on_a_new_sys_path_entry_is_seen_without_refresh(tmp_path, on_path, space):
    assert "cachednew" not in schemes()  # scan cached for the sys.path before
    site = make_dist(
        tmp_path / "site", "cached-new", "0.1", {"cachednew": "cached_new_mod:CachedStore"},
        _cached_plugin_source("cached_new_mod", "cachednew"),
    )
    on_path(site, "cached_new_mod")  # a new sys.path entry: a new cache key
    assert "cachednew" in schemes()
    assert open_store(f"cachednew://{space}").scheme == "cachednew"


def test_dist_added_to_an_already_scanned_path_entry_needs_refresh(tmp_path, on_path, space):
    site = tmp_path / "site"
    site.mkdir()
    on_path(site, "cached_late_mod")
    assert "cachedlate" not in schemes()  # this sys.path, with site on it, is scanned and cached
    make_dist(
        site, "cached-late", "0.1", {"cachedlate": "cached_late_mod:CachedStore"},
        _cached_plugin_source("cached_late_mod", "cachedlate"),
    )
    # Installed at runtime into a directory already on sys.path: the cached scan misses it,
    # and the error says what to do.
    assert "cachedlate" not in schemes()
    with pytest.raises(ConfigError, match=r"registry\.refresh\(\)"):
        open_store(f"cachedlate://{space}")
    registry.refresh()
    assert "cachedlate" in schemes()
    assert {p.scheme: p for p in plugins()}["cachedlate"].package == "cached-late"
    assert open_store(f"cachedlate://{space}").scheme == "cachedlate"


# --------------------------------------------------------------------------- (c) unknown scheme


def test_unknown_scheme_lists_installed_schemes():
    with pytest.raises(ConfigError) as err:
        open_store("nosuchscheme://bucket/prefix")
    msg = str(err.value)
    assert "'nosuchscheme'" in msg
    for scheme in BUILTINS:
        assert scheme in msg


def test_unknown_scheme_lists_third_party_schemes_too(demo_dist):
    with pytest.raises(ConfigError, match="demo"):
        plugin_class("nosuchscheme")


def test_bad_urls_are_config_errors():
    for url in ["", "relative/path", "file://host/dir", "memory:///no-bucket"]:
        with pytest.raises(ConfigError):
            open_store(url)


# --------------------------------------------------------------------------- (d) broken plugin


def test_plugin_that_fails_to_import(tmp_path, on_path, space):
    site = make_dist(
        tmp_path / "site",
        "broken-plugin",
        "0.1",
        {"broken": "broken_plugin_mod:BrokenStore"},
        {"broken_plugin_mod": "import shardstore_no_such_dependency_xyz\n"},
    )
    on_path(site, "broken_plugin_mod")
    # Listing still works and shows it; only opening its scheme fails.
    assert "broken" in schemes()
    with pytest.raises(ConfigError) as err:
        open_store("broken://bucket")
    msg = str(err.value)
    assert "'broken'" in msg
    assert "broken_plugin_mod:BrokenStore" in msg
    assert "shardstore_no_such_dependency_xyz" in msg
    assert isinstance(err.value.__cause__, ImportError)
    # The other plugins are unaffected.
    open_store(f"memory://{space}").put("k", b"v")


def test_plugin_whose_class_is_missing(tmp_path, on_path):
    site = make_dist(
        tmp_path / "site",
        "typo-plugin",
        "0.1",
        {"typo": "typo_plugin_mod:NoSuchClass"},
        {"typo_plugin_mod": "X = 1\n"},
    )
    on_path(site, "typo_plugin_mod")
    with pytest.raises(ConfigError, match="'typo'"):
        plugin_class("typo")


def test_plugin_that_is_not_a_blobstore(tmp_path, on_path):
    site = make_dist(
        tmp_path / "site",
        "notastore-plugin",
        "0.1",
        {"notastore": "notastore_mod:Thing", "notaclass": "notastore_mod:thing"},
        {"notastore_mod": "class Thing:\n    pass\nthing = Thing()\n"},
    )
    on_path(site, "notastore_mod")
    for scheme in ("notastore", "notaclass"):
        with pytest.raises(ConfigError, match=f"'{scheme}'.*not a BlobStore"):
            plugin_class(scheme)


# --------------------------------------------------------------------------- (e) options


def test_unknown_option_names_it_and_lists_accepted(space):
    with pytest.raises(ConfigError) as err:
        open_store(f"memory://{space}?no_such_option=1")
    msg = str(err.value)
    assert "'no_such_option'" in msg
    assert "page_size" in msg


def test_unknown_option_as_keyword(tmp_path):
    with pytest.raises(ConfigError) as err:
        open_store(f"file://{tmp_path}/s", fsink=False)
    msg = str(err.value)
    assert "'fsink'" in msg
    assert "create" in msg and "fsync" in msg


def test_bool_options_coerced_from_query(tmp_path):
    store = open_backend(f"file://{tmp_path}/x?fsync=false")
    assert store.options["fsync"] is False
    assert store.options["create"] is True  # default
    for text, expected in [("1", True), ("yes", True), ("ON", True), ("0", False), ("no", False), ("off", False)]:
        assert open_backend(f"file://{tmp_path}/x?fsync={text}").options["fsync"] is expected


def test_keyword_options_override_query(tmp_path):
    store = open_backend(f"file://{tmp_path}/x?fsync=false", fsync=True)
    assert store.options["fsync"] is True


def test_int_option_coerced_from_query(space):
    assert open_backend(f"memory://{space}?page_size=17").options["page_size"] == 17


def test_bad_bool_is_config_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        open_store(f"file://{tmp_path}/x?fsync=maybe")
    msg = str(err.value)
    assert "'fsync'" in msg and "maybe" in msg
    assert not (tmp_path / "x").exists()  # rejected before touching the filesystem


def test_bad_int_is_config_error(space):
    with pytest.raises(ConfigError, match="'page_size'.*int"):
        open_store(f"memory://{space}?page_size=lots")


def test_retry_options_from_query_are_taken_by_the_wrapper(space):
    store = open_store(f"memory://{space}?retry_attempts=2&retry_deadline=1.5&writer_id=w1&page_size=5")
    assert store.policy.attempts == 2
    assert store.policy.deadline == 1.5
    assert store.writer_id == "w1"
    assert store.inner.options["page_size"] == 5
    with pytest.raises(ConfigError, match="'retry_attempts'"):
        open_store(f"memory://{space}?retry_attempts=many")


SECRET_VALUE = "AKIA-very-secret-9f8e7d"


def test_secret_option_value_never_in_errors():
    table = {
        "secret_port": Option("secret_port", int, None, "a secret int", secret=True),
        "secret_flag": Option("secret_flag", bool, False, "a secret bool", secret=True),
        "token": Option("token", str, None, "a secret string", secret=True),
        "port": Option("port", int, None, "not secret"),
    }
    for name in ("secret_port", "secret_flag"):
        with pytest.raises(ConfigError) as err:
            coerce_options(table, {name: SECRET_VALUE}, location="x://bucket")
        msg = str(err.value)
        assert SECRET_VALUE not in msg and SECRET_VALUE not in repr(err.value)
        assert f"'{name}'" in msg and "<secret>" in msg
    # A misspelled (so unknown) secret option name is reported by name only.
    with pytest.raises(ConfigError) as err:
        coerce_options(table, {"tokn": SECRET_VALUE}, location="x://bucket")
    assert SECRET_VALUE not in str(err.value) and "'tokn'" in str(err.value)
    # Good values pass through; non-secret bad values are shown to help the user.
    assert coerce_options(table, {"token": SECRET_VALUE, "secret_port": "7"}, location="x://b")["secret_port"] == 7
    with pytest.raises(ConfigError, match="'not-a-port'"):
        coerce_options(table, {"port": "not-a-port"}, location="x://bucket")


def _loadable_builtins() -> dict[str, type]:
    out = {}
    for scheme in BUILTINS:
        try:
            out[scheme] = plugin_class(scheme)
        except ConfigError:
            pass  # a backend not written yet or whose SDK is missing; see its own tests
    return out


def test_builtin_class_scheme_matches_its_entry_point():
    # BackendStore refuses URLs whose scheme differs from cls.scheme, so a mismatch
    # between the entry-point name and the class attribute would make the scheme unusable.
    loaded = _loadable_builtins()
    assert {"memory", "file"} <= set(loaded)
    for scheme, cls in loaded.items():
        assert cls.scheme == scheme, f"{cls.__name__}.scheme is {cls.scheme!r}, registered as {scheme!r}"
        for name, opt in cls.OPTIONS.items():
            assert name == opt.name, f"{cls.__name__}.OPTIONS[{name!r}] is named {opt.name!r}"


@pytest.mark.parametrize("scheme", ["s3", "oci", "gs", "az"])
def test_declared_secret_options_are_not_echoed(scheme):
    """For every secret option a cloud plugin declares, the value never shows in an error."""
    cls = _loadable_builtins()[scheme]
    secrets = [o for o in cls.OPTIONS.values() if o.secret]
    assert secrets, f"{cls.__name__} declares no secret option"
    for opt in secrets:
        # Given alongside a bad option, through the URL query and as a keyword.
        with pytest.raises(ConfigError) as err:
            open_backend(f"{scheme}://bucket/p?{opt.name}={SECRET_VALUE}&no_such_option=1")
        assert SECRET_VALUE not in str(err.value)
        with pytest.raises(ConfigError) as err:
            open_store(f"{scheme}://bucket/p?no_such_option=1", **{opt.name: SECRET_VALUE})
        assert SECRET_VALUE not in str(err.value)
        if opt.type not in (str, object):  # only non-string types can fail conversion
            with pytest.raises(ConfigError) as err:
                coerce_options(cls.OPTIONS, {opt.name: SECRET_VALUE}, location=f"{scheme}://bucket")
            assert SECRET_VALUE not in str(err.value)
