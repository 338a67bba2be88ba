"""The GPT-2 tokenizer works with no network, from the shipped, checksummed rank file."""

import socket
import subprocess
import sys

import pytest

from bamctl.errors import BamctlError
from bamctl.tokenizer import GPT2_RANKS, get_tokenizer, gpt2_tokenizer

NO_NETWORK = """
import socket
def refuse(*args, **kwargs):
    raise OSError("network disabled in this test")
socket.socket.connect = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
from bamctl.tokenizer import get_tokenizer
print(get_tokenizer("gpt2").encode("The pass key is 12345."))
"""


def test_passkey_sentence_encodes_as_gpt2_with_network_unavailable():
    result = subprocess.run([sys.executable, "-c", NO_NETWORK], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[464, 1208, 1994, 318, 17031, 2231, 13]"


def test_round_trip_and_vocabulary():
    tokenizer = get_tokenizer("gpt2")
    text = "Hello, world! <|endoftext|> stays text.\n\n  Numbers: 3.14159"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.vocab_size == 50257 and tokenizer.eos_id == 50256
    assert 50256 not in tokenizer.encode("<|endoftext|>")


def test_corrupt_rank_file_is_one_clear_error(tmp_path):
    broken = tmp_path / "gpt2.tiktoken"
    broken.write_bytes(GPT2_RANKS.read_bytes()[:-100])
    with pytest.raises(BamctlError, match="corrupt"):
        gpt2_tokenizer(broken)


def test_missing_rank_file_is_one_clear_error(tmp_path):
    with pytest.raises(BamctlError, match="cannot be read"):
        gpt2_tokenizer(tmp_path / "absent.tiktoken")


def test_unknown_tokenizer_suggests_close_names():
    with pytest.raises(BamctlError, match="did you mean gpt2"):
        get_tokenizer("gpt-2")
