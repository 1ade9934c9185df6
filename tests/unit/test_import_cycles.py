"""No import cycle between the modules of hai_cluster, lazy imports inside functions included
(they hide a cycle rather than remove it); imports only for type checking do not count."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hai_cluster"


def module_names() -> dict[str, tuple[Path, list[str]]]:
    """module name -> (file, the package its relative imports start from)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
            out[".".join(parts)] = (path, parts)
        else:
            out[".".join(parts)] = (path, parts[:-1])
    return out


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, package) in modules.items():
        edges = graph[name]

        class Imports(ast.NodeVisitor):
            def visit_If(self, node):
                if ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                    for stmt in node.orelse:
                        self.visit(stmt)
                else:
                    self.generic_visit(node)

            def visit_Import(self, node):
                edges.update(a.name for a in node.names if a.name in modules)

            def visit_ImportFrom(self, node):
                base = package[:len(package) - node.level + 1] if node.level else []
                target = ".".join(base + (node.module.split(".") if node.module else []))
                for a in node.names:  # `from pkg import module` is an edge to the module
                    sub = f"{target}.{a.name}"
                    if sub in modules:
                        edges.add(sub)
                    elif target in modules:
                        edges.add(target)

        Imports().visit(ast.parse(path.read_text(), str(path)))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_check_sees_a_cycle_and_a_lazy_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    graph = import_graph()
    assert "hai_cluster.transport.ssh" in graph["hai_cluster.transport.connect"]  # imported inside a function
    assert "hai_cluster.agent.isolation" not in graph["hai_cluster.agent.runtimes"]  # only for type checking
