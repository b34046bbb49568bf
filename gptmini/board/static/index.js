// The ATTENTION tab: gptmini's TensorBoard plugin frontend. One ES module, no dependencies, no network beyond
// this plugin's own routes (runs, steps, attention, text). TensorBoard loads it in an iframe whose base URL is
// the plugin's route prefix, and calls render().
//
// Views: the model view (every layer x head as a small map, labelled by head type; click one to open it in the
// head view) and the head view (tokens on two sides, a line from each query to each key it attends to, one
// colour per head). A step slider over the logged steps, a second run side by side, your own text, and export
// of the current view as PNG or SVG.
//
// What the summaries mean - their tag, version, quantisation levels, byte layout, header keys, the head types with
// their titles and colours - is not written here: the page reads it from the backend's `contract` route, which
// serves gptmini.board.summary's own constants, and refuses data of another version or layout.

import {DRAW, PICKED, VIEWS, pickBar, said} from './views.js';

const SVG_NS = 'http://www.w3.org/2000/svg';
// the layout of the bytes this page reads (the contract names the one the backend writes; another is refused)
const LAYOUT = 'layer-head-tril-rows';
// a line is drawn for an attention weight of at least MIN_WEIGHT (about 1%)
const MIN_WEIGHT = 0.01;
// at most this many lines in the head view: beyond, only the strongest weights are drawn (the page stays quick)
const MAX_LINES = 12000;
const HEAD_COLOURS = [
  '#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#17becf',
  '#bcbd22', '#7f7f7f', '#393b79', '#ad494a', '#637939', '#8c6d31', '#843c39', '#7b4173',
];
// from the contract: head type name -> title and colour
const TYPE_COLOURS = {};
const TYPE_TITLES = {};

const state = {
  contract: null,      // gptmini.board.summary.contract() and the own-text limits, from the backend
  runs: [],            // [{run, tags, has_checkpoint}]
  run: null,
  compare: '',         // second run ('' = none)
  tag: null,
  steps: [],
  stepIndex: 0,
  view: 'model',       // 'model' | 'head'
  layer: 0,
  heads: null,         // Set of active head indices in the head view
  headCount: 0,        // the head count the picks were made for (the most heads of the panels shown)
  panels: [],          // the panels drawn: [{run, att} or {run, error}]
  text: null,          // own text shown instead of the probe (null: the logged probe)
  cache: new Map(),    // url -> decoded attention
  live: new Map(),     // url -> a run's logged steps or attribution (emptied as a run is picked or followed)
  notice: null,        // said once in the status by the next draw (a run shown that is gone)
};

let ui = {};
const timings = [];  // render timings, read by the benchmark: [{view, ms, heads, tokens}]

// ---------------------------------------------------------------------------------------------------------
// data

async function getJSON(url, options) {
  const response = await fetch(url, options);
  let body;
  try {
    body = await response.json();
  } catch (err) {
    throw new Error(`${url}: HTTP ${response.status}`);
  }
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

async function loadContract() {
  const contract = await getJSON('contract');
  if (contract.layout !== LAYOUT) {
    throw new Error(`the backend writes summaries in layout ${contract.layout}; this page reads ${LAYOUT}`);
  }
  for (const {name, title, colour} of contract.head_types) {
    TYPE_TITLES[name] = title;
    TYPE_COLOURS[name] = colour;
  }
  state.contract = contract;
}

const LEVELS = () => state.contract.levels;

// a response of the attention or text route, checked against the contract and against its own shape: every panel
// is read with its own run's layer and head counts, never another panel's
function decodeAttention(body) {
  const c = state.contract;
  if (body.version !== c.version) throw new Error(`summary version ${body.version}; this page reads ${c.version}`);
  const count = (x) => Number.isInteger(x) && x > 0;
  if (!count(body.n_layer) || !count(body.n_head) || !Array.isArray(body.tokens) || !body.tokens.length) {
    throw new Error('the summary has no valid n_layer, n_head and tokens');
  }
  const bytes = atob(body.data);
  const data = new Uint8Array(bytes.length);
  for (let i = 0; i < bytes.length; i++) data[i] = bytes.charCodeAt(i);
  const T = body.tokens.length;
  const tri = T * (T + 1) / 2;
  if (data.length !== body.n_layer * body.n_head * tri) {
    throw new Error(`${data.length} bytes for ${body.n_layer} × ${body.n_head} heads over ${T} tokens`);
  }
  return {...body, T, tri, data};
}

// the level (0..LEVELS) of attention from query i to key j <= i of head h in layer l
function level(att, l, h, i, j) {
  return att.data[(l * att.n_head + h) * att.tri + i * (i + 1) / 2 + j];
}

// the answer of `url` through `then`, asked once while `cache` holds it (a failed one is asked again)
async function cached(cache, url, then = (body) => body) {
  if (!cache.has(url)) cache.set(url, getJSON(url).then(then));
  try {
    return await cache.get(url);
  } catch (err) {
    cache.delete(url);
    throw err;
  }
}

function attention(run, step) {
  const url = `attention?run=${encodeURIComponent(run)}&tag=${encodeURIComponent(state.tag)}&step=${step}`;
  return cached(state.cache, url, decodeAttention);
}

// this page's id: with a draw's number, it lets the backend drop a text that a later draw superseded while it
// waited for the one computed before it
const PAGE = Math.random().toString(36).slice(2, 12) + Date.now().toString(36);

// `signal` aborts the request when a later draw supersedes the one that sent it (draw number `draw`)
async function ownText(run, text, signal, draw) {
  const body = await getJSON('text', {
    method: 'POST',
    headers: {'Content-Type': 'application/json'},
    body: JSON.stringify({run, text, page: PAGE, draw}),
    signal,
  });
  return decodeAttention(body);
}

// a run's logged steps, asked once per run until a run is picked or followTraining asks again
function stepsOf(run) {
  const url = `steps?run=${encodeURIComponent(run)}&tag=${encodeURIComponent(state.tag)}`;
  return cached(state.live, url, (body) => body.steps);
}

// a run's attribution at its logged steps ({steps, values[l][h][s]}), asked as its steps are
function attributionOf(run) {
  const url = `attribution?run=${encodeURIComponent(run)}&tag=${encodeURIComponent(state.tag)}`;
  return cached(state.live, url);
}

// the step of `run` shown beside the primary run's `step`: the same, else the latest before it; null when it
// logged none at or before it
function nearestStep(steps, step) {
  let best = null;
  for (const s of steps) if (s <= step) best = s;
  return best;
}

// ---------------------------------------------------------------------------------------------------------
// small DOM helpers

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') node.className = v;
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

// a byte of a character the token holds only part of (written \xNN by the tokenizer) as ⟨NN⟩
const bytesShown = (token) => token.replace(/\\x([0-9a-f]{2})/g, (_, hex) => `⟨${hex.toUpperCase()}⟩`);

function shown(token) {
  // spaces, tabs and newlines made visible; long tokens cut
  const s = bytesShown(token).replace(/\n/g, '↵').replace(/\t/g, '⇥').replace(/ /g, '␣');
  return s.length > 12 ? s.slice(0, 11) + '…' : s || '∅';
}

// a token whole, in quotes, as titles and the status name it (its bytes as ⟨NN⟩, not as escaped backslashes)
function quoted(token) {
  return JSON.stringify(bytesShown(token));
}

// `s` cut to at most `n` characters in the middle (a run's name differs at its start and at its end)
function middle(s, n) {
  return s.length <= n ? s : s.slice(0, Math.ceil(n / 2) - 1) + '…' + s.slice(s.length - Math.floor(n / 2));
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

function setStatus(message, isError = false) {
  ui.status.textContent = message;
  ui.status.classList.toggle('error', isError);
}

// ---------------------------------------------------------------------------------------------------------
// the model view: every layer x head as a heatmap (rows: queries, columns: keys)

const CELL = 84;  // CSS pixels of one map

function heatmap(att, l, h) {
  const T = att.T;
  const canvas = el('canvas', {width: T, height: T, class: 'map'});
  const ctx = canvas.getContext('2d');
  const image = ctx.createImageData(T, T);
  const px = image.data;
  const base = (l * att.n_head + h) * att.tri;
  for (let i = 0; i < T; i++) {
    const row = base + i * (i + 1) / 2;
    for (let j = 0; j < T; j++) {
      const o = (i * T + j) * 4;
      if (j > i) {  // masked: light grey
        px[o] = 245; px[o + 1] = 245; px[o + 2] = 245; px[o + 3] = 255;
        continue;
      }
      // white -> deep blue (RGBA bytes), with a square root so that weak attention stays visible
      const v = Math.sqrt(att.data[row + j] / LEVELS());
      px[o] = 255 - v * 247;
      px[o + 1] = 255 - v * 207;
      px[o + 2] = 255 - v * 148;
      px[o + 3] = 255;
    }
  }
  ctx.putImageData(image, 0, 0);
  return canvas;
}

function headType(att, l, h) {
  return att.head_types ? att.head_types[l][h] : null;
}

function scoreText(att, l, h) {
  const s = att.scores || {};
  const parts = [];
  // a score is null where the model gave no number (a diverged run)
  const value = (grid, digits) => (grid[l][h] === null ? '–' : grid[l][h].toFixed(digits));
  if (s.previous_token) parts.push(`previous-token ${value(s.previous_token, 2)}`);
  if (s.induction) parts.push(`induction ${value(s.induction, 2)}`);
  if (s.first_token) parts.push(`first-token ${value(s.first_token, 2)}`);
  if (s.mean_distance) parts.push(`mean distance ${value(s.mean_distance, 1)}`);
  return [parts.join(', '), sinkText(att, l, h)].filter(Boolean).join('\n');
}

// the head's sink share: on the first token, and on the learned sink where the model has one
function sinkText(att, l, h) {
  const sink = att.sink;
  if (!sink) return '';
  const part = (grid) => (grid[l][h] === null ? '–' : grid[l][h].toFixed(2));
  return `sink: first token ${part(sink.first)}` + (sink.learned ? `, learned sink ${part(sink.learned)}` : '');
}

// what the views of views.js use of this page
const viewContext = () => ({el, shown, quoted, plural, level, levels: LEVELS, setStatus, redraw: draw, attributionOf});

function modelView(att) {
  const grid = el('div', {class: 'grid'});
  grid.style.gridTemplateColumns = `max-content repeat(${att.n_head}, ${CELL}px)`;
  grid.append(el('div'));
  for (let h = 0; h < att.n_head; h++) grid.append(el('div', {class: 'colhead'}, `head ${h}`));
  for (let l = 0; l < att.n_layer; l++) {
    grid.append(el('div', {class: 'rowhead'}, `layer ${l}`));
    for (let h = 0; h < att.n_head; h++) {
      const type = headType(att, l, h);
      const about = `layer ${l}, head ${h}${type ? ': ' + TYPE_TITLES[type] : ''}\n${scoreText(att, l, h)}`;
      const cell = el('div', {
        class: 'cell',
        'data-layer': l,
        'data-head': h,
        title: `${about}\nclick: head view`,
        onclick: () => openHead(l, h),
      });
      const map = said(viewContext(), heatmap(att, l, h), att.T, att.T, (i, j) => mapValue(att, l, h, i, j),
        `${about}\nclick or Enter: head view`);
      map.addEventListener('keydown', (e) => { if (e.key === 'Enter') openHead(l, h); });
      cell.append(map);
      const label = el('div', {class: 'type'}, type ? TYPE_TITLES[type] : '\u00a0');
      if (type) label.style.color = TYPE_COLOURS[type];
      cell.append(label);
      grid.append(cell);
    }
  }
  return grid;
}

// a map's cell (under the pointer, or picked with the arrow keys): its query and key, by token, and the weight
function mapValue(att, l, h, i, j) {
  const where = `layer ${l}, head ${h}: query ${quoted(att.tokens[i])} (${i}) → key ${quoted(att.tokens[j])} (${j})`;
  return j > i ? `${where}: masked (a query sees only earlier keys)`
    : `${where}: ${(level(att, l, h, i, j) / LEVELS()).toFixed(2)}`;
}

function openHead(l, h) {
  state.view = 'head';
  state.layer = l;
  state.heads = new Set([h]);
  draw();
}

// ---------------------------------------------------------------------------------------------------------
// the head view: queries on the left, keys on the right, a line per weight >= MIN_WEIGHT, one colour per head

const ROW = 18;
const TOKEN_W = 110;
const GAP = 170;

// the head view of one panel, with that panel's own heads: heads picked beyond its count are not drawn
function headView(att) {
  const T = att.T;
  const width = 2 * TOKEN_W + GAP;
  const height = T * ROW + 30;
  const root = svg('svg', {width, height, viewBox: `0 0 ${width} ${height}`, class: 'headview'});
  const style = svg('style');
  style.textContent =
    'text{font:12px sans-serif;fill:#222}.tok{cursor:default;outline:none}.tok.hot text{font-weight:bold}' +
    '.tok:focus .hit{stroke:#f57c00}' +
    'text.hdr{font-size:11px;fill:#777}';
  root.append(style);
  const hdr = (x, anchor, s) => {
    const t = svg('text', {x, y: 12, 'text-anchor': anchor, class: 'hdr'});
    t.textContent = s;
    root.append(t);
  };
  hdr(TOKEN_W - 6, 'end', 'queries (attend from)');
  hdr(TOKEN_W + GAP + 6, 'start', 'keys (attend to)');
  const y = (i) => 30 + i * ROW + ROW / 2;
  const x0 = TOKEN_W, x1 = TOKEN_W + GAP;
  const lines = svg('g', {class: 'lines'});
  const heads = panelHeads(att);
  // every weight of at least MIN_WEIGHT, or the strongest MAX_LINES of them (long texts, many heads)
  const levels = LEVELS();
  const floor = Math.round(MIN_WEIGHT * levels);
  let minLevel = floor;
  const counts = new Array(levels + 1).fill(0);
  for (const h of heads) {
    for (let i = 0; i < T; i++) for (let j = 0; j <= i; j++) counts[level(att, state.layer, h, i, j)]++;
  }
  let total = 0;
  for (let v = levels; v >= floor; v--) {
    if (total + counts[v] > MAX_LINES) { minLevel = v + 1; break; }
    total += counts[v];
  }
  root.dataset.minLevel = minLevel;
  for (const h of heads) {
    const g = svg('g', {'data-head': h, stroke: HEAD_COLOURS[h % HEAD_COLOURS.length]});
    for (let i = 0; i < T; i++) {
      for (let j = 0; j <= i; j++) {
        const v = level(att, state.layer, h, i, j);
        if (v < minLevel) continue;
        const w = v / levels;
        g.append(svg('line', {
          x1: x0, y1: y(i), x2: x1, y2: y(j),
          'stroke-width': (0.5 + 2.5 * w).toFixed(2),
          'stroke-opacity': (0.1 + 0.9 * w).toFixed(3),
          'data-q': i, 'data-k': j, 'data-w': w.toFixed(3),
        }));
      }
    }
    lines.append(g);
  }
  root.append(lines);
  const left = svg('g', {class: 'queries'}), right = svg('g', {class: 'keys'});
  const weightLabels = [];
  for (let i = 0; i < T; i++) {
    for (const [side, group, x, anchor] of [['q', left, x0 - 6, 'end'], ['k', right, x1 + 6, 'start']]) {
      const g = svg('g', {class: `tok tok-${side}`, 'data-i': i, tabindex: 0});
      // the token's whole row takes the pointer (the gaps between glyphs would leave and re-enter it: flicker)
      const hit = svg('rect', {x: side === 'q' ? x0 - TOKEN_W : x1, y: y(i) - ROW / 2, width: TOKEN_W,
        height: ROW, fill: '#fff', 'fill-opacity': 0, class: 'hit'});
      const bar = svg('rect', {x: side === 'q' ? x0 - TOKEN_W : x1, y: y(i) - ROW / 2 + 1, width: 0,
        height: ROW - 2, fill: '#ffd54f', 'fill-opacity': 0.8});
      const t = svg('text', {x, y: y(i) + 4, 'text-anchor': anchor});
      t.textContent = shown(att.tokens[i]);
      const title = svg('title');
      title.textContent = `${i}: ${quoted(att.tokens[i])}`;
      g.setAttribute('aria-label', `${side === 'q' ? 'query' : 'key'} ${title.textContent}`);
      g.append(hit, bar, t, title);
      for (const on of ['mouseenter', 'focus']) g.addEventListener(on, () => focus(root, att, side, i, weightLabels));
      for (const off of ['mouseleave', 'blur']) g.addEventListener(off, () => unfocus(root, weightLabels));
      group.append(g);
      weightLabels.push({side, i, bar, text: t});
    }
  }
  root.append(left, right);
  return root;
}

// hover: only the lines of the token under the pointer; the other side's tokens show their weights as bars
function focus(root, att, side, i, labels) {
  const own = side === 'q' ? 'data-q' : 'data-k';
  for (const line of root.querySelectorAll('line')) {
    line.style.display = Number(line.getAttribute(own)) === i ? '' : 'none';
  }
  const heads = panelHeads(att);
  const weights = new Map();
  for (const h of heads) {
    for (let k = 0; k < att.T; k++) {
      const [q, key] = side === 'q' ? [i, k] : [k, i];
      if (key > q) continue;
      weights.set(k, (weights.get(k) || 0) + level(att, state.layer, h, q, key) / LEVELS() / heads.length);
    }
  }
  const parts = [];
  for (const label of labels) {
    const other = side === 'q' ? 'k' : 'q';
    if (label.side === other && weights.has(label.i)) {
      const w = weights.get(label.i);
      label.bar.setAttribute('width', (w * TOKEN_W).toFixed(1));
      if (w >= 0.005) parts.push([w, label.i]);
    }
    if (label.side === side && label.i === i) label.text.parentNode.classList.add('hot');
  }
  parts.sort((a, b) => b[0] - a[0]);
  const verb = side === 'q' ? 'attends to' : 'is attended to by';
  setStatus(`${quoted(att.tokens[i])} (${i}) ${verb}: ` +
    parts.slice(0, 6).map(([w, k]) => `${quoted(att.tokens[k])} (${k}) ${w.toFixed(2)}`).join(', ') +
    (heads.length > 1 ? `  (mean over ${heads.length} heads)` : ''));
}

// the heads picked that this panel's run has
function panelHeads(att) {
  return [...state.heads].filter((h) => h < att.n_head).sort((a, b) => a - b);
}

function unfocus(root, labels) {
  for (const line of root.querySelectorAll('line')) line.style.display = '';
  for (const label of labels) {
    label.bar.setAttribute('width', 0);
    label.text.parentNode.classList.remove('hot');
  }
  setStatus('');
}

// the layer and head pickers, over the largest counts of the panels shown (a panel draws the ones its run has);
// the head types named are the first panel's
function headControls(att, nLayer, nHead) {
  const bar = el('div', {class: 'headbar'});
  const layer = el('select', {class: 'layer-select', onchange: (e) => { state.layer = Number(e.target.value); draw(); }});
  for (let l = 0; l < nLayer; l++) {
    const o = el('option', {value: l}, `layer ${l}`);
    if (l === state.layer) o.selected = true;
    layer.append(o);
  }
  bar.append(layer, el('span', {class: 'caption'}, 'heads'));
  for (let h = 0; h < nHead; h++) {
    const on = state.heads.has(h);
    const type = h < att.n_head && state.layer < att.n_layer ? headType(att, state.layer, h) : null;
    const chip = el('button', {
      class: 'chip' + (on ? ' on' : ''),
      'data-head': h,
      title: `head ${h}${type ? ': ' + TYPE_TITLES[type] : ''} (click: show/hide; double-click: only this one)`,
      onclick: () => { on ? state.heads.delete(h) : state.heads.add(h); draw(); },
      ondblclick: () => { state.heads = new Set([h]); draw(); },
    }, type && type !== state.contract.default_type ? `${h} · ${TYPE_TITLES[type]}` : `${h}`);
    chip.style.setProperty('--c', HEAD_COLOURS[h % HEAD_COLOURS.length]);
    bar.append(chip);
  }
  bar.append(
    el('button', {class: 'small', onclick: () => { state.heads = new Set([...Array(nHead).keys()]); draw(); }}, 'all'),
    el('button', {class: 'small', onclick: () => { state.heads = new Set(); draw(); }}, 'none'));
  return bar;
}

// ---------------------------------------------------------------------------------------------------------
// drawing: one panel per run (the run, and the run compared with it)

async function panelsData(signal, ticket) {
  const runs = [state.run, ...(state.compare ? [state.compare] : [])];
  if (state.text !== null) {
    // one run after the other: the backend computes one text at a time
    const panels = [];
    for (const run of runs) {
      const info = state.runs.find((r) => r.run === run);
      if (!info.has_checkpoint) {
        panels.push({run, error: 'this run has no checkpoint: own text needs one'});
        continue;
      }
      try {
        panels.push({run, att: await ownText(run, state.text, signal, ticket)});
      } catch (err) {
        if (signal.aborted) throw err;  // superseded: the next run's request is never sent
        panels.push({run, error: err.message});
      }
    }
    return panels;
  }
  const step = state.steps[state.stepIndex];
  return Promise.all(runs.map(async (run, n) => {
    try {
      const steps = n === 0 ? [step] : await stepsOf(run);
      const s = nearestStep(steps, step);
      if (s === null) {
        return {run, note: `this run logged no step at or before step ${step} (its first: ${steps[0]})`};
      }
      return {run, att: await attention(run, s)};
    } catch (err) {
      return {run, error: err.message};
    }
  }));
}

let drawing = 0;   // the ticket of the latest draw() started
let settled = 0;   // the ticket of the latest draw() that ended (drawn or failed)
let drawAbort = null;  // aborts the own-text requests of the draw in flight

async function draw() {
  const ticket = ++drawing;
  // a later draw supersedes this one: the requests of the one before are aborted, not left to be computed
  if (drawAbort) drawAbort.abort();
  drawAbort = new AbortController();
  let panels;
  try {
    panels = await panelsData(drawAbort.signal, ticket);
  } catch (err) {
    if (ticket !== drawing) return;
    settled = ticket;
    setStatus(err.message, true);
    return;
  }
  if (ticket !== drawing) return;  // a later draw() superseded this one
  settled = ticket;
  state.panels = panels;
  const t0 = performance.now();
  const first = panels.find((p) => p.att);
  const shapes = panels.filter((p) => p.att).map((p) => p.att);
  const nLayer = Math.max(0, ...shapes.map((a) => a.n_layer));
  const nHead = Math.max(0, ...shapes.map((a) => a.n_head));
  // the head picks follow the shape shown: every head stays every head when the count changes (a 2-head run,
  // then a 4-head one: heads 0-3), a choice of some keeps those that exist (every head when none is left)
  if (first && nHead !== state.headCount) {
    const every = state.heads === null || state.heads.size === state.headCount;
    const kept = every ? [] : [...state.heads].filter((h) => h < nHead);
    state.heads = new Set(kept.length ? kept : [...Array(nHead).keys()]);
    state.headCount = nHead;
  }
  if (first && state.layer >= nLayer) state.layer = 0;
  ui.view.replaceChildren();
  if (state.view === 'head' && first) ui.view.append(headControls(first.att, nLayer, nHead));
  if (state.view in PICKED && first) ui.view.append(pickBar(viewContext(), first.att, nLayer, nHead, state.view));
  const row = el('div', {class: 'panels'});
  for (const p of panels) {
    // the run's name may break after its separators (a name with its overrides is one long word otherwise)
    const title = el('div', {class: 'panel-title'},
      ...p.run.split(/(?<=[,/=])/).flatMap((part, i) => (i ? [el('wbr'), part] : [part])));
    if (p.att) {
      const what = state.text !== null
        ? `your text, checkpoint of step ${p.att.step ?? '?'}`
        : `step ${p.att.step}`;
      title.append(el('span', {class: 'sub'}, `  ${what} · ${plural(p.att.n_layer, 'layer')} × ${plural(p.att.n_head, 'head')} · ${plural(p.att.T, 'token')}`));
      if (p.att.left_out && p.att.left_out.length) {
        title.append(el('span', {class: 'sub thinned'},
          `  (not in this run's vocabulary, left out: ${p.att.left_out.map((c) => JSON.stringify(c)).join(' ')})`));
      }
    }
    const panel = el('div', {class: 'panel', 'data-run': p.run}, title);
    if (p.error) panel.append(el('div', {class: 'error'}, p.error));
    else if (p.note) panel.append(el('div', {class: 'note'}, p.note));
    else if (DRAW[state.view]) panel.append(DRAW[state.view](viewContext(), p.att, state.text === null ? p.run : undefined));
    else if (state.view === 'model') panel.append(modelView(p.att));
    else if (state.layer >= p.att.n_layer) {
      panel.append(el('div', {class: 'note'},
        `this run has ${plural(p.att.n_layer, 'layer')}: layer ${state.layer} is not in it`));
    } else {
      const view = headView(p.att);
      const level = Number(view.dataset.minLevel);
      const missing = [...state.heads].filter((h) => h >= p.att.n_head);
      if (missing.length) {
        title.append(el('span', {class: 'sub thinned'},
          ` · this run has ${plural(p.att.n_head, 'head')}: ${missing.length > 1 ? 'heads' : 'head'} ${missing.sort((a, b) => a - b).join(', ')} not in it`));
      }
      if (level > Math.round(MIN_WEIGHT * LEVELS())) {
        title.append(el('span', {class: 'sub thinned'}, ` · lines for weights ≥ ${(level / LEVELS()).toFixed(2)} only`));
      }
      panel.append(view);
    }
    row.append(panel);
  }
  ui.view.append(row);
  // a run box narrower than its run's name ends it with "…": its title holds the whole name
  for (const select of [ui.runSelect, ui.compareSelect]) select.title = select.value;
  ui.modelBtn.classList.toggle('on', state.view === 'model');
  ui.headBtn.classList.toggle('on', state.view === 'head');
  for (const [name, button] of Object.entries(ui.viewBtns)) button.classList.toggle('on', state.view === name);
  ui.stepLabel.textContent = state.text !== null ? 'your text' : `step ${state.steps[state.stepIndex] ?? '–'}`;
  ui.slider.disabled = state.text !== null || state.steps.length < 2;
  ui.back.hidden = state.text === null;
  // the neuron, lens and head-map views are HTML tables and pictures: Save exports the model and head views only
  const exportable = !DRAW[state.view];
  for (const button of [ui.savePng, ui.saveSvg]) {
    button.disabled = !exportable;
    button.title = exportable ? '' : NOT_EXPORTED;
  }
  // a panel names its run above its message; the status repeats the message, with the run shortened when two
  // panels are shown (a run's name may be 200 characters: said once in full, in its panel)
  const errors = panels.filter((p) => p.error);
  if (errors.length) {
    setStatus(errors.map((p) => (panels.length > 1 ? `${middle(p.run, 48)}: ` : '') + p.error).join('  ·  '), true);
    // a run deleted while shown answers errors only: the runs are listed again, and a gone one is left
    if (state.text === null) refreshRuns().catch(() => {});
  } else setStatus(state.notice || '');
  state.notice = null;
  const sync = performance.now() - t0;
  requestAnimationFrame(() => {
    const ms = performance.now() - t0;
    if (first) timings.push({view: state.view, ms, sync, heads: first.att.n_layer * first.att.n_head, tokens: first.att.T});
    document.body.dataset.rendered = String(ticket);
  });
}

// ---------------------------------------------------------------------------------------------------------
// export: the current view as SVG or PNG

const EXPORT_FONT = 'sans-serif';
const LABEL_W = 320;     // a panel's run name and subtitle wrap within its maps' width, or this much if narrower
const MESSAGE_W = 480;   // a panel's message (an error, a note) wraps within this width
const NAME_LINES = 6;    // at most this many lines of a run's name, the last ending in "…" when cut

// the SVG may lay a line out a little wider than the canvas measured it (its own rounding of glyph advances)
const MEASURE_SLACK = 2;

// `text` as lines no wider than `width` pixels in `font`, measured by the browser that draws the export: broken
// after spaces and after , / = (run names and paths), inside a word only where the word alone is wider
function wrapLines(ctx, text, font, width, maxLines = Infinity) {
  ctx.font = font;
  const fits = (s) => ctx.measureText(s).width + MEASURE_SLACK <= width;
  const lines = [];
  let line = '';
  for (const piece of text.split(/(?<=[\s,/=])/)) {
    if (fits(line + piece)) {
      line += piece;
      continue;
    }
    if (line.trim()) lines.push(line.trimEnd());
    line = piece;
    while (line.length > 1 && !fits(line)) {
      let n = line.length - 1;
      while (n > 1 && !fits(line.slice(0, n))) n--;
      lines.push(line.slice(0, n));
      line = line.slice(n);
    }
  }
  if (line.trim()) lines.push(line.trimEnd());
  if (lines.length <= maxLines) return lines;
  let last = lines[maxLines - 1];
  while (last && !fits(last + '…')) last = last.slice(0, -1);
  return [...lines.slice(0, maxLines - 1), last + '…'];
}

// one panel of the export: {w, h, body(x, top)}, its maps or message at the size they are drawn
function exportBody(panel, ctx) {
  const head = panel.querySelector('svg.headview');
  const cells = [...panel.querySelectorAll('.cell')];
  if (!head && !cells.length) {
    // a panel without maps (an error, or a layer its run lacks): its message, wrapped
    const message = panel.querySelector('.error, .note');
    const font = `12px ${EXPORT_FONT}`;
    const lines = message ? wrapLines(ctx, message.textContent, font, MESSAGE_W) : [];
    const fill = message && message.classList.contains('error') ? '#b00020' : '#555';
    return {
      w: Math.ceil(Math.max(0, ...lines.map((l) => ctx.measureText(l).width))) + MEASURE_SLACK,
      h: 15 * lines.length + 6,
      body: (x, top) => lines.map((l, i) => `<text x="${x}" y="${top + 14 + 15 * i}" font-size="12" ` +
        `font-family="${EXPORT_FONT}" fill="${fill}">${esc(l)}</text>`).join(''),
    };
  }
  if (head) {
    return {
      w: Number(head.getAttribute('width')),
      h: Number(head.getAttribute('height')),
      body: (x, top) => new XMLSerializer().serializeToString(head).replace('<svg', `<svg x="${x}" y="${top}"`),
    };
  }
  const nHead = Math.max(...cells.map((c) => Number(c.dataset.head))) + 1;
  const nLayer = Math.max(...cells.map((c) => Number(c.dataset.layer))) + 1;
  const cw = CELL + 6, ch = CELL + 20;
  return {
    w: 60 + nHead * cw,
    h: 20 + nLayer * ch,
    body: (x, top) => cells.map((c) => {
      const l = Number(c.dataset.layer), hd = Number(c.dataset.head);
      const cx = x + 60 + hd * cw, cy = top + 20 + l * ch;
      const type = c.querySelector('.type').textContent.trim();
      return `<image x="${cx}" y="${cy}" width="${CELL}" height="${CELL}" style="image-rendering:pixelated" ` +
        `preserveAspectRatio="none" href="${c.querySelector('canvas').toDataURL()}"/>` +
        `<text x="${cx}" y="${cy + CELL + 12}" font-size="10" font-family="${EXPORT_FONT}" ` +
        `fill="${TYPE_COLOURS[Object.keys(TYPE_TITLES).find((k) => TYPE_TITLES[k] === type)] || '#999'}">${esc(type)}</text>`;
    }).join('') +
      [...Array(nLayer).keys()].map((l) => `<text x="${x}" y="${top + 20 + l * ch + CELL / 2}" font-size="11" font-family="${EXPORT_FONT}">layer ${l}</text>`).join('') +
      [...Array(nHead).keys()].map((hd) => `<text x="${x + 60 + hd * cw}" y="${top + 14}" font-size="11" font-family="${EXPORT_FONT}">head ${hd}</text>`).join(''),
  };
}

function currentSVG() {
  // one SVG holding every panel: the head views as they are, the model view's maps as embedded images. The
  // panels are as wide as their maps: a long run name wraps above them instead of widening the image
  const ctx = document.createElement('canvas').getContext('2d');
  const nameFont = `bold 13px ${EXPORT_FONT}`, subFont = `12px ${EXPORT_FONT}`;
  const blocks = [...ui.view.querySelectorAll('.panel')].map((panel) => {
    const block = exportBody(panel, ctx);
    const labelW = Math.max(block.w, LABEL_W);
    const sub = [...panel.querySelectorAll('.panel-title .sub')].map((s) => s.textContent).join('').trim();
    block.name = wrapLines(ctx, panel.dataset.run, nameFont, labelW, NAME_LINES);
    block.sub = sub ? wrapLines(ctx, sub, subFont, labelW) : [];
    ctx.font = nameFont;
    const nameW = Math.max(0, ...block.name.map((l) => ctx.measureText(l).width));
    ctx.font = subFont;
    const subW = Math.max(0, ...block.sub.map((l) => ctx.measureText(l).width));
    block.w = Math.max(block.w, Math.ceil(Math.max(nameW, subW)) + MEASURE_SLACK);
    block.labelH = 16 * block.name.length + 15 * block.sub.length;
    return block;
  });
  const top = Math.max(0, ...blocks.map((b) => b.labelH)) + 8;  // the maps of every panel start on one line
  const parts = [];
  let x = 0, height = 0;
  for (const b of blocks) {
    b.name.forEach((l, i) => parts.push(`<text x="${x}" y="${13 + 16 * i}" font-size="13" ` +
      `font-family="${EXPORT_FONT}" font-weight="bold">${esc(l)}</text>`));
    b.sub.forEach((l, i) => parts.push(`<text x="${x}" y="${16 * b.name.length + 12 + 15 * i}" ` +
      `font-size="12" font-family="${EXPORT_FONT}" fill="#757575">${esc(l)}</text>`));
    parts.push(b.body(x, top));
    x += b.w + 30;
    height = Math.max(height, top + b.h);
  }
  const pad = 12, width = Math.max(0, x - 30) + 2 * pad, full = height + 2 * pad;
  return `<svg xmlns="${SVG_NS}" width="${width}" height="${full}" viewBox="0 0 ${width} ${full}">` +
    `<rect width="100%" height="100%" fill="white"/><g transform="translate(${pad},${pad})">${parts.join('')}</g></svg>`;
}

function esc(s) {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

function download(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = el('a', {href: url, download: name});
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// named after the first panel that shows maps (the run beside when the Run box's panel is an error), at that
// panel's own step; the run's part bounded (a run's name may be 200 characters, a file name at most 255 bytes)
function fileName(ext) {
  const shown = state.panels.find((p) => p.att) || state.panels[0] || {run: state.run};
  const run = middle(shown.run.replace(/[^\w.-]+/g, '_'), 101).replace('…', '--');
  const what = state.view === 'head' ? `layer${state.layer}` : 'model';
  const when = state.text !== null ? 'text' : `step${shown.att ? shown.att.step : state.steps[state.stepIndex]}`;
  return `attention-${run}-${what}-${when}.${ext}`;
}

const NOT_EXPORTED = 'this view is not exported (HTML tables and pictures): Save exports the model and head views; ' +
  'scripts/attention_tab_screenshot.py saves this one';

function saveSVG() {
  if (DRAW[state.view]) { setStatus(NOT_EXPORTED, true); return; }
  try {
    download(new Blob([currentSVG()], {type: 'image/svg+xml'}), fileName('svg'));
  } catch (err) {
    setStatus(`SVG export failed: ${err.message || err}`, true);
  }
}

async function pngBlob() {
  const text = currentSVG();
  const image = new Image();
  const url = URL.createObjectURL(new Blob([text], {type: 'image/svg+xml'}));
  await new Promise((resolve, reject) => { image.onload = resolve; image.onerror = reject; image.src = url; });
  const scale = 2;  // sharp on high-density screens and in documents
  const canvas = el('canvas', {width: image.width * scale, height: image.height * scale});
  const ctx = canvas.getContext('2d');
  ctx.imageSmoothingEnabled = false;
  ctx.scale(scale, scale);
  ctx.drawImage(image, 0, 0);
  URL.revokeObjectURL(url);
  return new Promise((resolve) => canvas.toBlob(resolve, 'image/png'));
}

async function savePNG() {
  if (DRAW[state.view]) { setStatus(NOT_EXPORTED, true); return; }
  try {
    download(await pngBlob(), fileName('png'));
  } catch (err) {
    setStatus(`PNG export failed: ${err.message || err}`, true);
  }
}

// ---------------------------------------------------------------------------------------------------------
// controls

function setSteps(steps, index) {
  state.steps = steps;
  state.stepIndex = index;
  ui.slider.max = Math.max(0, steps.length - 1);
  ui.slider.value = index;
  ui.ticks.replaceChildren(...steps.map((s, i) => el('option', {value: i, label: s})));
}

async function selectRun(run) {
  state.run = run;
  const info = state.runs.find((r) => r.run === run);
  state.tag = info.tags.includes(state.contract.tag) ? state.contract.tag : info.tags[0];
  state.live.clear();  // the runs' steps and attribution as they are now
  const steps = await stepsOf(run);
  setSteps(steps, steps.length - 1);
  offerText(info);
}

function offerText(info) {
  ui.textBtn.disabled = !info.has_checkpoint;
  ui.textInput.placeholder = info.has_checkpoint
    ? 'Type a sentence to see this run\'s attention on it'
    : 'This run has no checkpoint: your own text needs one';
}

function runSelect(cls, withNone, onchange) {
  const select = el('select', {class: cls, onchange});
  fillRuns(select, withNone);
  return select;
}

// the options of a run box: every run listed, the one picked kept
function fillRuns(select, withNone) {
  const picked = select.value;
  select.replaceChildren(...(withNone ? [el('option', {value: ''}, '— none —')] : []),
    ...state.runs.map((r) => el('option', {value: r.run, title: r.run}, r.run)));
  if (picked) select.value = picked;
}

// the runs the backend lists now: a run started after the tab opened joins both run boxes, and a run whose first
// checkpoint was written since offers own text
async function refreshRuns() {
  const listing = await getJSON('runs');
  const names = (runs) => runs.map((r) => r.run).join('\n');
  const changed = names(listing.runs) !== names(state.runs);
  state.runs = listing.runs;
  if (changed) {
    fillRuns(ui.runSelect, false);
    fillRuns(ui.compareSelect, true);
  }
  const info = state.runs.find((r) => r.run === state.run);
  if (info) offerText(info);
  await leaveGoneRuns();
}

// the run shown or the run beside is no longer listed (its folder deleted): the first run listed is shown instead
// (nothing beside), said once in the status; with no run left, the tab says so
async function leaveGoneRuns() {
  const known = (run) => state.runs.some((r) => r.run === run);
  const gone = [state.run, state.compare].filter((run) => run && !known(run));
  if (!gone.length) return;
  if (state.compare && !known(state.compare)) {
    state.compare = '';
    ui.compareSelect.value = '';
  }
  if (!known(state.run)) {
    if (!state.runs.length) {
      ui.view.replaceChildren(el('div', {class: 'empty'}, 'No run holds attention summaries any more.'));
      return;
    }
    await selectRun(state.runs[0].run);
    ui.runSelect.value = state.run;
  }
  state.notice = `${gone.map((run) => middle(run, 48)).join(' and ')}: no longer listed (deleted?); ` +
    `showing ${middle(state.run, 48)}`;
  await draw();
}

function controls() {
  ui.runSelect = runSelect('run-select', false, async (e) => { await selectRun(e.target.value); draw(); });
  ui.compareSelect = runSelect('compare-select', true, (e) => { state.compare = e.target.value; draw(); });
  ui.modelBtn = el('button', {class: 'tab', onclick: () => { state.view = 'model'; draw(); }}, 'Model view');
  ui.headBtn = el('button', {class: 'tab', onclick: () => { state.view = 'head'; draw(); }}, 'Head view');
  ui.viewBtns = Object.fromEntries(Object.entries(VIEWS).map(([name, title]) => [name,
    el('button', {class: `tab view-${name}`, onclick: () => { state.view = name; draw(); }}, title)]));
  ui.ticks = el('datalist', {id: 'step-ticks'});
  ui.slider = el('input', {type: 'range', min: 0, max: 0, value: 0, step: 1, class: 'step-slider', list: 'step-ticks',
    oninput: (e) => { state.stepIndex = Number(e.target.value); draw(); }});
  ui.stepLabel = el('span', {class: 'step-label'}, '');
  // no maxlength: the box would cut a longer paste without a word; the length is said instead, and a text over
  // the limit is not sent (the box and the button say the same)
  const maxChars = state.contract.max_text_chars;
  const tooLong = (n) => `your text has ${n} characters; at most ${maxChars} (and ` +
    `${state.contract.max_text_tokens} tokens) can be shown: shorten it, a longer text is not sent`;
  let warned = false;  // the status shows tooLong's message
  ui.textInput = el('input', {type: 'text', class: 'text-input',
    onkeydown: (e) => { if (e.key === 'Enter') ui.textBtn.click(); },
    oninput: () => {
      const n = ui.textInput.value.length;
      if (n > maxChars) setStatus(tooLong(n), true);
      else if (warned) setStatus('');
      warned = n > maxChars;
    }});
  ui.textBtn = el('button', {class: 'text-go', onclick: () => {
    const text = ui.textInput.value;
    if (!text.trim()) { setStatus('type a sentence first', true); return; }
    if (text.length > maxChars) {
      setStatus(tooLong(text.length), true);
      warned = true;
      return;
    }
    if (text === state.text && settled !== drawing) return;  // this text is being computed: pressed again
    state.text = text;
    draw();
  }}, 'Show attention');
  ui.back = el('button', {class: 'back', hidden: '', onclick: () => { state.text = null; draw(); }}, 'Back to the logged probe');
  ui.status = el('div', {class: 'status', role: 'status'});  // read out as it changes
  const top = el('div', {class: 'bar'},
    el('label', {}, 'Run ', ui.runSelect),
    el('label', {}, 'beside ', ui.compareSelect),
    el('span', {class: 'tabs'}, ui.modelBtn, ui.headBtn, ...Object.values(ui.viewBtns)),
    el('span', {class: 'save'}, 'Save ',
      ui.savePng = el('button', {class: 'save-png', onclick: savePNG}, 'PNG'),
      ui.saveSvg = el('button', {class: 'save-svg', onclick: saveSVG}, 'SVG')));
  const steps = el('div', {class: 'bar'}, el('span', {class: 'caption'}, 'Logged step'), ui.slider, ui.ticks, ui.stepLabel);
  const text = el('div', {class: 'bar'}, ui.textInput, ui.textBtn, ui.back);
  const legend = el('div', {class: 'legend'}, 'Head types: ',
    ...Object.entries(TYPE_TITLES).map(([k, v]) => {
      const s = el('span', {class: 'legend-item'}, v);
      s.style.color = TYPE_COLOURS[k];
      return s;
    }),
    el('span', {class: 'hint'}, ' · rows: queries, columns: keys · hover a map (or Tab to it, then the arrow keys) for its tokens and weights, click it (Enter) for its head view · hover or Tab to a token in the head view'));
  return el('div', {class: 'controls'}, top, steps, text, legend, ui.status);
}

export async function render() {
  document.head.append(el('link', {rel: 'stylesheet', href: './static/style.css'}));
  const root = el('div', {class: 'attention-tab'});
  document.body.append(root);
  let listing;
  try {
    await loadContract();
    listing = await getJSON('runs');
  } catch (err) {
    root.append(el('div', {class: 'error'}, `cannot read the runs: ${err.message}`));
    return;
  }
  state.runs = listing.runs;
  if (!state.runs.length) {
    root.append(el('div', {class: 'empty'}, 'No run holds attention summaries yet: train with the default callbacks.'));
    return;
  }
  root.append(controls());
  ui.view = el('div', {class: 'view'});
  root.append(ui.view);
  await selectRun(state.runs[0].run);
  await draw();
  setInterval(followTraining, FOLLOW_MS);
  followReload();
}

// New runs and the steps of a run still training: picked up every FOLLOW_MS and at each of TensorBoard's reloads
// (its reload button, its periodic reload); when the newest step was shown, the new newest is shown.
const FOLLOW_MS = 30000;

async function followTraining() {
  if (document.hidden) return;
  let steps;
  try {
    state.live.clear();  // every run's steps and attribution asked again (a run still training logged more)
    await refreshRuns();
    if (state.text !== null) return;
    steps = await stepsOf(state.run);
  } catch (err) {
    return;  // the next poll tries again
  }
  // the steps themselves, not their count: past 100 validations TensorBoard keeps a sample of 100 (always with
  // the newest), so a new step leaves the count as it was
  if (String(steps) === String(state.steps)) return;
  const atEnd = state.stepIndex === state.steps.length - 1;
  const step = state.steps[state.stepIndex];
  setSteps(steps, atEnd ? steps.length - 1 : Math.max(0, steps.indexOf(nearestStep(steps, step))));
  // the newest step shown moves on; the circuits view's map over training gains the new steps
  if (atEnd || state.view === 'circuits' || state.steps[state.stepIndex] !== step) draw();
}

// TensorBoard's reloads, through its channel to plugin frames (the frame hands TensorBoard a MessagePort with
// "experimental.bootstrap"; TensorBoard sends "experimental.DataReloaded" after each reload as JSON messages
// {type, id, payload, error, isReply} and waits for a reply to each). Without it the FOLLOW_MS poll remains.
function followReload() {
  if (window.parent === window) return;
  const channel = new MessageChannel();
  channel.port1.onmessage = (event) => {
    let message;
    try {
      message = JSON.parse(event.data);
    } catch (err) {
      return;
    }
    if (!message || message.isReply) return;
    if (message.type === 'experimental.DataReloaded') followTraining();
    channel.port1.postMessage(JSON.stringify({type: message.type, id: message.id, payload: null, error: null, isReply: true}));
  };
  window.parent.postMessage('experimental.bootstrap', '*', [channel.port2]);
}

// for the browser test and the benchmark
window.gptminiAttention = {state, timings, currentSVG, pngBlob, fileName};
