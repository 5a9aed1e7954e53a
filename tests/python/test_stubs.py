# The type stubs (attn/__init__.pyi) against the module: every public name is typed, with the
# parameter names the extension really takes, and every function and layer has a docstring.
import ast
import pathlib

import pytest

import attn

STUB = pathlib.Path(attn.__file__).with_name("__init__.pyi")
LAYERS = [
    "AdditiveAttention",
    "DotProductAttention",
    "MultiHeadAttention",
    "GeneralAttention",
    "GaussianKernelPooling",
]


def stub_tree():
    return ast.parse(STUB.read_text(encoding="utf-8"))


def stub_parameters(function):
    """Names of a stub function's parameters, with "*" where keyword-only ones start."""
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args]
    if arguments.kwonlyargs:
        names += ["*"] + [a.arg for a in arguments.kwonlyargs]
    return [name for name in names if name != "self"]


def runtime_parameters(function):
    """Names of a nanobind function's parameters, read from the signature opening its __doc__."""
    signature = function.__doc__.splitlines()[0]
    inside = signature[signature.index("(") + 1 : signature.rindex(")")]
    names, depth, current = [], 0, ""
    for char in inside + ",":
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        if char == "," and depth == 0:
            names.append(current.strip().split(":")[0].split("=")[0].strip())
            current = ""
        else:
            current += char
    return [name for name in names if name and name != "self"]


def test_stub_package_files_are_installed():
    assert STUB.exists()
    assert STUB.with_name("py.typed").exists()


def test_every_public_name_is_in_the_stub():
    defined = {
        node.name for node in stub_tree().body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
    }
    assert set(attn.__all__) <= defined
    # attn.torch and attn.transformers appear once imported (by the tests using them); they have
    # their own annotated sources.
    submodules = {"torch", "transformers"}
    assert set(attn.__all__) == {name for name in dir(attn) if not name.startswith("_")} - submodules


@pytest.mark.parametrize(
    "name",
    [
        n
        for n in attn.__all__
        if callable(getattr(attn, n)) and not isinstance(getattr(attn, n), type) and n != "load"
    ],
)
def test_function_parameters_match(name):
    stub = next(
        node for node in stub_tree().body if isinstance(node, ast.FunctionDef) and node.name == name
    )
    assert stub_parameters(stub) == runtime_parameters(getattr(attn, name))
    assert len(getattr(attn, name).__doc__.splitlines()) > 1, f"{name} has no docstring"


@pytest.mark.parametrize("name", LAYERS)
def test_layer_methods_match(name):
    tree = stub_tree()
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    methods = {}
    for class_name in ("_AttentionLayer", name):
        methods.update(
            {
                node.name: node
                for node in classes[class_name].body
                if isinstance(node, ast.FunctionDef)
            }
        )
    runtime = getattr(attn, name)
    public = {member for member in dir(runtime) if not member.startswith("_")}
    assert public <= set(methods) | {"training"}, public - set(methods)
    for method in [
        "__init__",
        "forward",
        "__call__",
        "backward",
        "load_state_dict",
        "save",
        "load",
        "train",
    ]:
        assert stub_parameters(methods[method]) == runtime_parameters(
            getattr(runtime, method)
        ), method
    assert runtime.__doc__ and ("book" in runtime.__doc__ or "Nadaraya" in runtime.__doc__)


def test_kv_cache_matches():
    classes = {node.name: node for node in stub_tree().body if isinstance(node, ast.ClassDef)}
    cache_class = classes["KVCache"]
    methods = {node.name: node for node in cache_class.body if isinstance(node, ast.FunctionDef)}
    public = {member for member in dir(attn.KVCache) if not member.startswith("_")}
    assert public == set(methods) - {"__init__"}, public ^ (set(methods) - {"__init__"})
    for method in ["__init__", "append", "reserve", "clear", "keys", "values"]:
        assert stub_parameters(methods[method]) == runtime_parameters(
            getattr(attn.KVCache, method)
        ), method
