from llmdiag.collect.paste import data_lines, unquote_line


def test_quotes_fences_and_indentation_go():
    assert unquote_line("> vllm:num_requests_running 3\r\n") == "vllm:num_requests_running 3"
    assert unquote_line(">> > INFO 11-30 06:02:31 [loggers.py:335] x") == "INFO 11-30 06:02:31 [loggers.py:335] x"
    assert unquote_line("    DCGM_FI_DEV_GPU_UTIL 99") == "DCGM_FI_DEV_GPU_UTIL 99"
    assert unquote_line("```text") == "" and unquote_line("> ~~~") == ""


def test_line_numbers_survive():
    text = "thread header\n```\n> a 1\n\nb 2\n```"
    assert data_lines(text) == ["thread header", "", "a 1", "", "b 2", ""]
