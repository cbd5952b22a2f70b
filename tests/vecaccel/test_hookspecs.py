"""The hook specs: every hook a ``vecaccel_*`` spec typed with public names and documented,
every built-in plugin implementing specs only with the arguments they name, and a plugin that
strays from them refused."""

from __future__ import annotations

import inspect
import typing

import pluggy
import pytest

import vecaccel
from vecaccel import hookspecs
from vecaccel.cli import Commands

SPECS = {
    name: function
    for name, function in vars(hookspecs).items()
    if inspect.isfunction(function) and function.__module__ == hookspecs.__name__
}

#: The names a spec's annotations may use: the package's public API and the command line's.
PUBLIC = {**{name: getattr(vecaccel, name) for name in vecaccel.__all__}, "Commands": Commands}


def test_the_specs_are_the_hooks_the_manager_knows() -> None:
    pm = vecaccel.get_plugin_manager()
    known = {name for name in vars(pm.hook) if name.startswith("vecaccel_")}
    assert set(SPECS) == known
    assert set(SPECS) == {
        "vecaccel_register_backends",
        "vecaccel_register_envs",
        "vecaccel_add_commands",
        "vecaccel_register_algorithms",
    }


@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_spec_is_typed_with_public_names_and_says_when_it_is_called(name: str) -> None:
    spec = SPECS[name]
    options = getattr(spec, "vecaccel_spec", None)
    assert options is not None, f"{name} is not marked with the vecaccel hookspec marker"
    assert not options["firstresult"] and not options["historic"]
    doc = inspect.getdoc(spec) or ""
    assert "Called " in doc and "not ``firstresult``" in doc, doc
    hints = typing.get_type_hints(spec, globalns=vars(hookspecs), localns=PUBLIC)
    assert hints.pop("return") is type(None)
    assert set(hints) == set(inspect.signature(spec).parameters)
    for parameter in hints:
        assert parameter in doc, f"{name}'s docstring does not describe {parameter!r}"


def test_every_builtin_plugin_implements_specs_with_their_arguments() -> None:
    pm = vecaccel.get_plugin_manager()
    pm.check_pending()  # no hookimpl without a spec
    implemented: set[str] = set()
    for name, spec in SPECS.items():
        arguments = set(inspect.signature(spec).parameters)
        for impl in getattr(pm.hook, name).get_hookimpls():
            assert set(impl.argnames) <= arguments, (impl.plugin_name, name, impl.argnames)
            implemented.add(name)
    assert implemented == set(SPECS)  # each hook has a built-in implementation


class MisspelledHook:
    @vecaccel.hookimpl
    def vecaccel_register_backend(self, registry) -> None:
        """One letter short of ``vecaccel_register_backends``."""


class ArgumentNotInTheSpec:
    @vecaccel.hookimpl
    def vecaccel_register_backends(self, registry, machine) -> None:
        """Asks for an argument the spec does not name."""


def test_a_plugin_straying_from_the_specs_is_refused(fresh_plugin_manager: None) -> None:
    pm = vecaccel.get_plugin_manager()
    pm.register(MisspelledHook(), name="test-misspelled-hook")
    with pytest.raises(pluggy.PluginValidationError, match="vecaccel_register_backend"):
        pm.check_pending()
    with pytest.raises(pluggy.PluginValidationError, match="machine"):
        pm.register(ArgumentNotInTheSpec(), name="test-argument-not-in-the-spec")
