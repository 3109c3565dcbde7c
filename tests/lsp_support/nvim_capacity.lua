-- Headless Neovim (>= 0.11) with `memlsp.capacity` set: the PT017 diagnostic on the line of the
-- first request that fails on that device, and its hover. Writes what it saw to $OUT_JSON. Used
-- by tests/lsp_nvim.rs.
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
vim.lsp.start({
  name = "memlsp",
  cmd = { os.getenv("LSP_CMD"), "lsp" },
  root_dir = os.getenv("WS_ROOT"),
  settings = { memlsp = { capacity = os.getenv("CAPACITY") } },
}, { bufnr = bufnr })

local function ours()
  return vim.tbl_filter(function(d) return d.code == "PT017" end, vim.diagnostic.get(bufnr))
end
if not vim.wait(40000, function() return #ours() > 0 end, 50) then
  result.error = "no PT017 diagnostic"
  return finish(1)
end
result.diagnostics = vim.tbl_map(function(d)
  return { lnum = d.lnum, severity = d.severity, source = d.source, code = d.code, message = d.message }
end, ours())
local d = ours()[1]
local hv = vim.lsp.buf_request_sync(bufnr, "textDocument/hover", {
  textDocument = vim.lsp.util.make_text_document_params(bufnr),
  position = { line = d.lnum, character = 8 },
}, 5000)
for _, r in pairs(hv or {}) do result.hover = r.result and r.result.contents and r.result.contents.value end
finish(0)
