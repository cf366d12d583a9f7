"""A Griffe extension for the reference (mkdocs.yml): a class whose docstring holds a placeholder
line such as ``{training_options}``, which the class completes when it is imported (the launch
operator's training options come from TrainingConfig), is documented as Python sees it: with
the completed docstring and its ``__init__`` defaults' values (``0.01``, not the expression
``TrainingConfig.learning_rate`` that Griffe reads from the source)."""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import griffe

_PLACEHOLDER = re.compile(r"^\s*\{\w+\}\s*$", re.M)


class CompletedDocstrings(griffe.Extension):
    def on_class(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        if cls.docstring is None or not _PLACEHOLDER.search(cls.docstring.value):
            return
        runtime = getattr(importlib.import_module(cls.module.path), cls.name)
        cls.docstring = griffe.Docstring(inspect.getdoc(runtime) or "", lineno=cls.docstring.lineno,
                                         endlineno=cls.docstring.endlineno, parent=cls,
                                         parser=cls.docstring.parser, parser_options=cls.docstring.parser_options)
        init = cls.members.get("__init__")
        if isinstance(init, griffe.Function):
            for name, parameter in inspect.signature(runtime.__init__).parameters.items():
                if name in init.parameters and parameter.default is not parameter.empty:
                    init.parameters[name].default = repr(parameter.default)
