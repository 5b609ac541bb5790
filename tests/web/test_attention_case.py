"""The Case page of an attention row: a vllm mla row as the H200 wrote it (tests/web/data) shows the module,
the attention backend, the cache it read, the decode/prefill split and each projection's kernel."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operatorx.result import Row
from operatorx.store import Store
from tests.web.conftest import serving, watched_page

ROW = Path(__file__).parent / "data" / "vllm_mla_row.json"


@pytest.fixture(scope="module")
def attention_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    doc = json.loads(ROW.read_text())
    run, raw = doc["run"], doc["row"]
    db = tmp_path_factory.mktemp("attention") / "results.db"
    store = Store(str(db))
    row = Row.from_json(raw)
    info = {k: v for k, v in run.items() if k not in ("id", "started_at", "finished_at", "state", "testlist",
                                                       "backend")}
    store.begin_run(run["id"], run["started_at"], run["testlist"], run["backend"], "cuda", info,
                    [Row.missing(row.case, row.backend, run["testlist"], row.case_index)])
    store.put_row(run["id"], row)
    store.finish_run(run["id"], run["finished_at"])
    store.close()
    with serving(str(db)) as url:
        yield f"{url}/case/{run['id']}/{row.case_index}", raw


def test_the_case_page_names_what_ran_for_an_attention_row(browser, attention_url):
    url, raw = attention_url
    meta = raw["metrics"]["backend_meta"]
    with watched_page(browser) as page:
        page.goto(url)
        page.wait_for_selector("section[data-section='Attention']")
        text = page.locator("section[data-section='Attention'] dl.kv").inner_text()
        assert "DeepseekV2MLAAttention" in text
        assert "FLASH_ATTN_MLA (FlashAttnMLABackend, FlashAttnMLAImpl)" in text
        cache = meta["kv_cache"]
        assert f"{cache['spec']}, {cache['dtype']}, blocks of {cache['block_size']} tokens" in text
        assert "decode 16, long_extend 0, prefill 0" in text
        assert "CUDA-graph replay (FULL_AND_PIECEWISE)" in text
        assert "fp8_block, Fp8Config" in text
        layers = page.locator("section[data-section='Attention'] table tbody tr")
        assert layers.count() == len(meta["projections"]["layers"]) == 4
        kernel = meta["projections"]["layers"]["fused_qkv_a_proj"]["kernel"]
        assert layers.first.locator("td").all_inner_texts() == ["fused_qkv_a_proj", "Fp8LinearMethod", kernel]
        # the Backend section still lists every key as recorded
        assert page.locator("section[data-section='Backend']").count() == 1
