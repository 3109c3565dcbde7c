-- `:checkhealth memlsp`: the server binary this config starts, its version, Neovim's version and
-- whether a memlsp client is running.
local M = {}

local health = vim.health

-- The command the config starts: `vim.lsp.config('memlsp')` on 0.11+, else setup()'s or the default.
local function server_cmd()
  local ok, cfg = pcall(function()
    return vim.lsp.config and vim.lsp.config.memlsp
  end)
  if ok and type(cfg) == 'table' and type(cfg.cmd) == 'table' then
    return cfg.cmd, 'vim.lsp.config'
  end
  local m = require('memlsp')
  if m.config and type(m.config.cmd) == 'table' then
    return m.config.cmd, "require('memlsp').setup()"
  end
  return m.defaults.cmd, 'the default'
end

function M.check()
  health.start('memlsp')
  if vim.fn.has('nvim-0.10') == 1 then
    health.ok('Neovim ' .. tostring(vim.version()))
  else
    health.error('Neovim ' .. tostring(vim.version()) .. ' is too old', { 'memlsp needs Neovim 0.10 or later' })
  end

  local cmd, from = server_cmd()
  local exe = cmd[1]
  local path = vim.fn.exepath(exe)
  if path == '' then
    health.error(('server binary `%s` (cmd from %s) not found on PATH'):format(exe, from), {
      'pip install memlsp   (or: uv tool install memlsp; from a clone: pip install .)',
      "or give the full path: vim.lsp.config('memlsp', { cmd = { '/path/to/memlsp', 'lsp' } })",
    })
    return
  end
  local res = vim.system({ path, '--version' }, { text = true }):wait(10000)
  local version = vim.trim(res.stdout or '')
  if res.code == 0 and version:match('^memlsp %d') then
    health.ok(('server binary: %s (%s; cmd from %s: %s)'):format(path, version, from, table.concat(cmd, ' ')))
  else
    health.error(('server binary %s did not answer `--version` (exit %s): %s'):format(
      path, tostring(res.code), vim.trim((res.stderr or '') .. version)), { 'reinstall it: pip install --force-reinstall memlsp' })
  end

  local clients = vim.lsp.get_clients({ name = 'memlsp' })
  if #clients > 0 then
    health.ok(('%d memlsp client(s) running (root %s)'):format(#clients, tostring(clients[1].config.root_dir)))
  else
    health.info('no memlsp client running now (it starts when a Python buffer opens)')
  end
end

return M
