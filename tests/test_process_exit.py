"""How the ``bamctl`` process ends: with the status its command chose, even where vLLM ran in it.

vLLM's threads outside Python (ZeroMQ's, the engine client's) can abort the interpreter's
teardown after every result is written (``terminate called without an active exception``, exit
-6: seen on `bamctl lm-eval` with a ``vllm:`` model). The stand-in below aborts in teardown the
same way, from a finaliser, so the test sees whether teardown ran, not whether vLLM's race hit."""

import subprocess
import sys
import textwrap

import pytest

# A process that imports bamctl, arms an abort for the interpreter's teardown, registers an exit
# handler that leaves a mark, and runs `bamctl ARGS` as the `bamctl` script does.
PROGRAM = textwrap.dedent("""
    import atexit, os, sys, types
    mark, vllm_ran, *args = sys.argv[1:]
    if vllm_ran == "yes":
        sys.modules["vllm"] = types.ModuleType("vllm")

    class AbortsInTeardown:
        def __del__(self):
            os.abort()

    armed = AbortsInTeardown()
    atexit.register(lambda: open(mark, "w").write("ran"))
    sys.argv = ["bamctl", *args]
    from bamctl.cli import entry
    entry()
""")


def _run(tmp_path, vllm_ran: bool, *args: str) -> tuple[subprocess.CompletedProcess, bool]:
    mark = tmp_path / f"exit-handler-{vllm_ran}-{len(args)}"
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(mark), "yes" if vllm_ran else "no", *args],
                          capture_output=True, text=True, timeout=120)
    return done, mark.exists()


@pytest.mark.parametrize("args, status", [(["--version"], 0), (["no-such-command"], 2)])
def test_where_vllm_ran_the_process_ends_with_its_commands_status_and_exit_handlers_run(tmp_path, args, status):
    plain, plain_handler = _run(tmp_path, False, *args)
    # the control: without vLLM the process goes through teardown, and the stand-in aborts it
    assert plain.returncode == -6 and plain_handler
    done, handler_ran = _run(tmp_path, True, *args)
    assert done.returncode == status, done.stderr
    assert handler_ran  # exit handlers (temporary folders, multiprocessing's children) still run
    if status == 0:
        assert done.stdout.startswith("bamctl ")  # what it printed was flushed before the end
    else:
        assert "no-such-command" in done.stderr
