// 引擎每一步的图：读 #trace-data 里的记录，滑块 / 上一步 / 下一步 / 左右方向键换步。每一步两个状态：
// ① batch 准备好（进前向之前），② 前向之后（采样出 token、三个长度前进）。不取任何外部资源。
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("trace-data").textContent);
  const traces = DATA.traces, diff = DATA.diff;
  const nSteps = Math.max(1, ...traces.map(t => t.steps.length));
  const slider = document.getElementById("slider"), label = document.getElementById("label");
  const panels = document.getElementById("panels"), tip = document.getElementById("tip");
  let pos = 0;

  function el(tag, cls, text, attrs) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }
  function tok(t, id) {
    const s = t.vocab[String(id)];
    return s === undefined ? String(id) : s.replace(/\n/g, "⏎").replace(/^ /, "␣");
  }
  function colorMap(t) {  // 请求的颜色按它第一次出现的顺序，和 uid 的值无关
    const m = new Map();
    for (const s of t.steps) for (const r of s.reqs) if (!m.has(r.uid)) m.set(r.uid, "r" + (m.size % 6));
    return uid => (uid < 0 ? "rd" : (m.get(uid) || "rd"));
  }
  function numRow(name, values, key, cls) {
    const row = el("div", "row", null, {"data-key": key});
    row.append(el("span", "rowlabel", name));
    values.forEach((v, j) => row.append(el("span", "cell " + (cls ? cls(j) : ""), v, {"data-key": key + ":" + j})));
    return row;
  }

  function requests(box, t, s, k, after, color) {
    box.append(el("h2", null, "请求：三个长度和生成的文字"));
    s.reqs.forEach((r, i) => {
      const a = after && s.after ? s.after[i] : r, pre = after && s.after ? "after:" : "req:";
      const div = el("div", "req " + color(r.uid));
      const name = el("div", "name");
      name.append("请求 ", el("span", "num", r.uid, {"data-key": "req:" + i + ":uid"}), " · 页表第 ",
                  el("span", "num", r.table_idx, {"data-key": "req:" + i + ":table_idx"}), " 行");
      div.append(name);
      const max = r.prompt_len + t.max_new_tokens, bar = el("div", "bar", null, {"data-key": pre + i});
      const c = el("span", "cached"), x = el("span", "extend");
      c.style.left = "0"; c.style.width = (100 * a.cached_len / max) + "%";
      x.style.left = c.style.width; x.style.width = (100 * (a.device_len - a.cached_len) / max) + "%";
      bar.append(c, x);
      div.append(bar);
      const lens = el("div", "lens");
      for (const f of ["cached_len", "device_len", "extend_len"]) {
        lens.append(f + " = ", el("b", "num", a[f], {"data-key": pre + i + ":" + f}), "　");
      }
      lens.append("（上限 " + max + " = 提示词 " + r.prompt_len + " + 最多生成 " + t.max_new_tokens + "）");
      div.append(lens);
      const prev = after ? (s.texts || [])[i] : (k > 0 && t.steps[k - 1].texts ? t.steps[k - 1].texts[i] : "");
      const text = el("div", "text");
      text.append(el("span", "note", (t.prompts[r.uid] !== undefined ? t.prompts[r.uid] : "") + " → "),
                  el("span", "gen", prev || "", {"data-key": "text:" + i}));
      div.append(text);
      box.append(div);
    });
  }

  function batchRows(box, t, s, after, color) {
    const h = el("h2", null, "这一步的 batch：");
    h.append(el("span", "mono", s.phase, {"data-key": "phase"}), "，" + s.input_ids.length + " 个新 token 拼成一行");
    box.append(h);
    const owner = [];
    [...s.reqs, ...s.dummies.map(d => ({...d, uid: -1}))].forEach(r => {
      for (let j = 0; j < r.device_len - r.cached_len; j++) owner.push(r.uid);
    });
    const cls = j => color(owner[j] === undefined ? -1 : owner[j]) + " tok";
    box.append(numRow("token", s.input_ids.map(id => tok(t, id)), "tokens", cls));
    box.append(numRow("input_ids", s.input_ids, "input_ids", cls));
    box.append(numRow("positions", s.positions, "positions", cls));
    if (s.out_loc) box.append(numRow("out_loc", s.out_loc, "out_loc", cls));
    else box.append(el("p", "note", "第 " + t.chapter + " 章还没有 out_loc：KV 不写进池里的槽位（第 4 章起才有）。"));
  }

  function pageTable(box, t, s, after, color) {
    box.append(el("h2", null, "页表：每行一个请求，第 j 格是位置 j 的 KV 所在的槽位"));
    const rows = [...s.reqs, ...s.dummies.map(d => ({...d, uid: -1}))];
    const ps = s.pool.page_size;
    s.page_table.forEach((row, i) => {
      const r = rows[i], div = el("div", "row " + color(r.uid), null, {"data-key": "pt:" + i});
      div.append(el("span", "rowlabel", (r.uid < 0 ? "假请求" : "请求 " + r.uid) + " · 第 " + r.table_idx + " 行"));
      row.forEach((slot, p) => {
        if (p > 0 && p % ps === 0) div.append(el("span", "gap"));
        const writing = !after && p >= r.cached_len ? " writing" : "";
        div.append(el("span", "cell" + writing, slot, {"data-key": "pt:" + i + ":" + p,
          "data-tip": "位置 " + p + " → 槽位 " + slot + "（第 " + Math.floor(slot / ps) + " 页第 " + (slot % ps) + " 个）"}));
      });
      box.append(div);
    });
  }

  function pool(box, t, s, after, color) {
    const P = s.pool, ps = P.page_size, owner = new Map();
    const pageOwner = new Map();
    for (const [slot, uid] of s.slots) if (uid >= 0) pageOwner.set(Math.floor(slot / ps), uid);
    const shared = new Map();  // 一个槽位被几个位置共用：页表写错了（正确的引擎里不会有）
    for (const [slot, uid, p] of s.slots) {
      if (owner.has(slot)) shared.set(slot, (shared.get(slot) || [owner.get(slot)]).concat([[uid, p]]));
      owner.set(slot, [uid, p]);
    }
    const byUid = new Map(s.reqs.map((r, i) => [r.uid, [r, after && s.after ? s.after[i] : r]]));
    const free = P.num_pages - s.pages.length - (P.dummy_page !== null && !s.pages.includes(P.dummy_page) ? 1 : 0);
    box.append(el("h2", null, "KV 池：" + P.num_pages + " 页 × " + ps + " 个槽位，用到 " + s.pages.length +
                  " 页，空闲 " + free + " 页" + (P.dummy_page !== null ? "，第 " + P.dummy_page + " 页是假页" : "")));
    const legend = el("div", "legend");
    const sample = (cls, text) => { const sp = el("span"); sp.append(el("span", "slot " + cls), text); legend.append(sp); };
    sample("filled r0", "已写入的 KV"); sample("writing r0", "这一步要写（out_loc）"); sample("", "空闲");
    if (P.dummy_page !== null) sample("dummyslot", "假页");
    if (shared.size) sample("shared r0", "被几个位置共用（页表写错了）");
    box.append(legend);
    const grid = el("div", "pool");
    for (let pg = 0; pg < P.num_pages; pg++) {
      const page = el("div", "page" + (pg === P.dummy_page ? " dummy" : ""), null, {"data-page": pg});
      page.append(el("span", "pno", pg));
      for (let slot = pg * ps; slot < (pg + 1) * ps; slot++) {
        const o = owner.get(slot);
        let cls = "slot", text = "", tipText = "槽位 " + slot + " · 第 " + pg + " 页 · " +
          (pageOwner.has(pg) ? "这一页已经分给请求 " + pageOwner.get(pg) + "，这个槽位还没用到" : "空闲");
        if (pg === P.dummy_page || (o && o[0] < 0)) {
          cls += " dummyslot"; tipText = "槽位 " + slot + " · 第 " + pg + " 页 · 假页：凑批的假请求写这里，不属于任何请求";
        }
        if (o && o[0] >= 0) {
          const [uid, p] = o, [r, a] = byUid.get(uid);
          const state = p < a.cached_len ? " filled" : (!after && p < r.device_len ? " writing" : "");
          cls += " " + color(uid) + state; text = p;
          tipText = "槽位 " + slot + " · 第 " + pg + " 页\n请求 " + uid + " · 位置 " + p + " · token " +
            JSON.stringify(tok(t, r.tokens[p])) + " (" + r.tokens[p] + ")" + (state === " writing" ? "\n这一步写入" : "");
        }
        if (shared.has(slot)) {
          cls += " shared";
          tipText += "\n注意：这个槽位同时是 " + shared.get(slot).map(([u, p]) => "请求 " + u + " 的位置 " + p).join("、") +
            " 的 KV：后写的覆盖先写的";
        }
        page.append(el("span", cls, text, {"data-slot": slot, "data-tip": tipText}));
      }
      grid.append(page);
    }
    box.append(grid);
  }

  function attention(box, t, s) {
    box.append(el("h2", null, "注意力元数据（attn_backend.prepare_metadata 准备的）"));
    const show = ["cu_seqlens_q", "cu_seqlens_k", "indices", "decode_slots"];
    for (const name of show.filter(n => s.attn[n] !== undefined)) {
      const v = s.attn[name];
      if (v.length && Array.isArray(v[0])) {
        box.append(el("p", "note", name + "：decode 时每个请求一行历史槽位，补齐到最长的那个；补的格子（淡色）指向自己的第 0 个槽位，注意力权重是 0。"));
        v.forEach((row, i) => {
          const len = (s.reqs[i] || s.dummies[i - s.reqs.length] || {device_len: row.length}).device_len;
          box.append(numRow(name + "[" + i + "]", row, "attn:" + name + ":" + i, j => (j >= len ? "pad" : "")));
        });
      } else box.append(numRow(name, v, "attn:" + name));
    }
  }

  function sampled(box, t, s, after, color) {
    box.append(el("h2", null, "采样出的 token"));
    if (!after) { box.append(el("p", "note", "前向之后才有：按 → 看这一步的结果。")); return; }
    const row = el("div", "row", null, {"data-key": "sampled"});
    row.append(el("span", "rowlabel", "每个请求一个"));
    s.sampled.forEach((id, i) => row.append(el("span", "cell " + color(s.reqs[i].uid),
      id === null ? "—" : tok(t, id) + " (" + id + ")", {"data-key": "sampled:" + i})));
    box.append(row);
  }

  function panel(t, pi, k, after) {
    const box = el("section", "panel", null, {"data-trace": pi}), color = colorMap(t);
    box.append(el("h2", null, (t.role ? t.role + " · " : "") + t.checkpoint + " · page_size=" + t.page_size));
    const s = t.steps[k];
    if (!s) {
      box.append(el("p", "error", "这份记录没有第 " + (k + 1) + " 步" + (t.error ? "：" + t.error : "")));
      return box;
    }
    if (after && !s.after) box.append(el("p", "error", "这一步前向出错：" + (t.error || "没有写回采样结果")));
    requests(box, t, s, k, after, color);
    batchRows(box, t, s, after, color);
    if (s.page_table) { pageTable(box, t, s, after, color); pool(box, t, s, after, color); }
    else box.append(el("p", "note", "第 " + t.chapter + " 章还没有页表和 KV 池（第 4 章才有）：" +
                        "KV 存在每个请求自己的列表里，每一步 torch.cat 变长，所以这里没有槽位可画。"));
    if (s.attn) attention(box, t, s);
    else if (t.chapter < 5) box.append(el("p", "note", "第 " + t.chapter + " 章还没有注意力后端（第 5 章起由 prepare_metadata 准备元数据）。"));
    sampled(box, t, s, after, color);
    return box;
  }

  function mark(box, key, cls, text) {
    for (let k = key; ; k = k.slice(0, k.lastIndexOf(":"))) {
      const e = box.querySelector('[data-key="' + k + '"]');
      if (e) { e.classList.add(cls); if (text) e.setAttribute("data-tip", text); return; }
      if (k.indexOf(":") < 0) { box.classList.add(cls); return; }
    }
  }

  function render() {
    const k = pos >> 1, after = (pos & 1) === 1, s0 = (traces[0].steps[k] || {});
    slider.value = pos;
    label.textContent = "第 " + (k + 1) + " / " + nSteps + " 步 · " + (s0.phase || "—") + " · " +
      (after ? "② 前向之后" : "① batch 准备好");
    document.body.dataset.step = k; document.body.dataset.state = after ? "after" : "prepared";
    panels.replaceChildren(...traces.map((t, i) => panel(t, i, k, after)));
    if (diff && diff.step === k && diff.state === (after ? "after" : "prepared")) {
      const boxes = panels.querySelectorAll(".panel");
      mark(boxes[0], diff.key, "diverge", diff.message);
      if (boxes[1]) mark(boxes[1], diff.key, "diverge-ref");
    }
    fit();
  }

  function go(p) { pos = Math.max(0, Math.min(2 * nSteps - 1, p)); render(); }
  function fit() {  // 在书里的 iframe 中：按内容撑高，最多书页窗口的九成（再长就在里面滚，换步的按钮一直在顶上）
    try {
      const f = window.frameElement;
      if (f) f.style.height = Math.min(document.documentElement.scrollHeight + 2, Math.round(window.parent.innerHeight * 0.9)) + "px";
    } catch (e) { /* file:// 下不同源，保持 iframe 自己的高度 */ }
  }
  function theme() {
    let dark = window.matchMedia("(prefers-color-scheme: dark)").matches;
    try {
      const body = window.parent !== window ? window.parent.document.body : null;
      if (body && body.dataset.mdColorScheme) dark = body.dataset.mdColorScheme === "slate";
    } catch (e) { /* 不同源：跟随系统 */ }
    document.documentElement.dataset.theme = dark ? "dark" : "light";
  }

  slider.min = 0; slider.max = 2 * nSteps - 1;
  panels.style.setProperty("--n", String(traces.length));  // 几份记录就并排几列
  slider.addEventListener("input", () => go(Number(slider.value)));
  document.getElementById("prev").addEventListener("click", () => go(pos - 1));
  document.getElementById("next").addEventListener("click", () => go(pos + 1));
  document.addEventListener("keydown", e => {
    if (e.target === slider || (e.key !== "ArrowLeft" && e.key !== "ArrowRight")) return;
    e.preventDefault(); go(pos + (e.key === "ArrowRight" ? 1 : -1));
  });
  document.addEventListener("mouseover", e => {
    const t = e.target.closest ? e.target.closest("[data-tip]") : null;
    if (!t) { tip.style.display = "none"; return; }
    tip.textContent = t.getAttribute("data-tip"); tip.style.display = "block";
    const r = t.getBoundingClientRect();
    tip.style.left = Math.min(r.left, window.innerWidth - tip.offsetWidth - 4) + "px";
    tip.style.top = (r.bottom + 4 + tip.offsetHeight > window.innerHeight ? r.top - tip.offsetHeight - 4 : r.bottom + 4) + "px";
  });
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", theme);
  try {
    if (window.parent !== window) new MutationObserver(theme).observe(window.parent.document.body, {attributes: true});
  } catch (e) { /* 不同源 */ }
  window.addEventListener("resize", fit);
  theme();
  const jump = document.getElementById("jump");
  if (diff && jump) jump.addEventListener("click", () => go(2 * diff.step + (diff.state === "after" ? 1 : 0)));
  go(diff ? 2 * diff.step + (diff.state === "after" ? 1 : 0) : 0);
})();
