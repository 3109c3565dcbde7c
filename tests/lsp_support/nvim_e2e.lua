-- Headless Neovim (>= 0.11) drives the real memlsp binary: diagnostics, inlay hints (raw and
-- rendered), hover, the preferred quick fix applied through Neovim's own edit code, and a
-- command. Writes what it saw to $OUT_JSON. Used by tests/lsp_nvim.rs.
local out_path = os.getenv("OUT_JSON")
local result = { nvim = tostring(vim.version()) }
local function finish(code)
  local f = assert(io.open(out_path, "w"))
  f:write(vim.json.encode(result))
  f:close()
  vim.cmd((code == 0) and "qa!" or ("cq " .. code))
end

vim.cmd("edit " .. vim.fn.fnameescape(os.getenv("PY_FILE")))
local bufnr = vim.api.nvim_get_current_buf()
local client_id = vim.lsp.start({
  name = "memlsp",
  cmd = { os.getenv("LSP_CMD"), "lsp" },
  root_dir = os.getenv("WS_ROOT"),
  settings = { memlsp = { topSites = 10 } },
}, { bufnr = bufnr })
local client = vim.lsp.get_client_by_id(client_id)
local want = os.getenv("WANT_CODE")

local function ours()
  return vim.tbl_filter(function(d) return d.code == want end, vim.diagnostic.get(bufnr))
end
if not vim.wait(20000, function() return #ours() > 0 end, 50) then
  result.error = "no " .. want .. " diagnostic"
  return finish(1)
end
result.offset_encoding = client.offset_encoding
result.diagnostics = vim.tbl_map(function(d)
  return { lnum = d.lnum, col = d.col, severity = d.severity, source = d.source, code = d.code,
           message = d.message }
end, vim.diagnostic.get(bufnr))

vim.lsp.inlay_hint.enable(true, { bufnr = bufnr })
vim.wait(5000, function() return #vim.lsp.inlay_hint.get({ bufnr = bufnr }) > 0 end, 50)
result.inlay_hints = vim.tbl_map(function(h)
  local label = h.inlay_hint.label
  if type(label) == "table" then label = label[1].value end
  return { line = h.inlay_hint.position.line, label = label }
end, vim.lsp.inlay_hint.get({ bufnr = bufnr }))

-- Findings follow edits: three lines inserted above move the diagnostic (and its hint) down by
-- three; deleting its line withdraws it; putting the text back restores it.
local d0 = ours()[1]
local text0 = vim.api.nvim_buf_get_lines(bufnr, d0.lnum, d0.lnum + 1, false)[1]
local function at(lnum)
  return vim.wait(10000, function()
    local ds = ours()
    if lnum == nil then return #ds == 0 end
    return #ds > 0 and ds[1].lnum == lnum
  end, 20)
end
vim.api.nvim_buf_set_lines(bufnr, 0, 0, false, { "# one", "# two", "# three" })
result.moved_to = at(d0.lnum + 3) and d0.lnum + 3 or (ours()[1] and ours()[1].lnum)
vim.wait(5000, function()
  for _, h in ipairs(vim.lsp.inlay_hint.get({ bufnr = bufnr })) do
    if h.inlay_hint.position.line == d0.lnum + 3 then return true end
  end
  return false
end, 50)
result.moved_hints = vim.tbl_map(function(h)
  local label = h.inlay_hint.label
  if type(label) == "table" then label = label[1].value end
  return { line = h.inlay_hint.position.line, label = label }
end, vim.lsp.inlay_hint.get({ bufnr = bufnr }))
vim.api.nvim_buf_set_lines(bufnr, d0.lnum + 3, d0.lnum + 4, false, {})
result.gone_when_deleted = at(nil)
vim.api.nvim_buf_set_lines(bufnr, d0.lnum + 3, d0.lnum + 3, false, { text0 })
vim.api.nvim_buf_set_lines(bufnr, 0, 3, false, {})
result.restored = at(d0.lnum)

local d = ours()[1]
local hv = vim.lsp.buf_request_sync(bufnr, "textDocument/hover", {
  textDocument = vim.lsp.util.make_text_document_params(bufnr),
  position = { line = d.lnum, character = d.col },
}, 5000)
for _, r in pairs(hv or {}) do result.hover = r.result and r.result.contents and r.result.contents.value end

local lsp_diags = vim.tbl_map(function(x) return x.user_data.lsp end, ours())
local ca = vim.lsp.buf_request_sync(bufnr, "textDocument/codeAction", {
  textDocument = vim.lsp.util.make_text_document_params(bufnr),
  range = { start = { line = d.lnum, character = 0 }, ["end"] = { line = d.lnum, character = 0 } },
  context = { diagnostics = lsp_diags, only = { "quickfix" } },
}, 5000)
result.code_actions = {}
for _, r in pairs(ca or {}) do
  for _, a in ipairs(r.result or {}) do
    table.insert(result.code_actions, a.title)
    if a.isPreferred and a.edit then
      vim.lsp.util.apply_workspace_edit(a.edit, client.offset_encoding)
    end
  end
end
result.fixed_line = vim.api.nvim_buf_get_lines(bufnr, d.lnum, d.lnum + 1, false)[1]

local ec = client:request_sync("workspace/executeCommand",
  { command = "memlsp.reanalyze", arguments = {} }, 5000, bufnr)
result.execute_command = ec and ec.result
finish(0)
