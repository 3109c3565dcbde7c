-- memlsp for Neovim 0.10 (and later): `require('memlsp').setup(opts)`.
--
--   vim.opt.rtp:append('/path/to/memlsp/editors/nvim')
--   require('memlsp').setup({
--     cmd = { 'memlsp', 'lsp' },          -- or { '/path/to/memlsp', 'lsp' }
--     settings = { memlsp = { pathMappings = { ['/workspace/proj'] = '${workspaceFolder}' } } },
--     inlay_hints = true,                 -- turn inlay hints on in attached buffers
--   })
--
-- On Neovim 0.11+ prefer `vim.lsp.enable('memlsp')` (lsp/memlsp.lua in this directory); setup()
-- still works there.
local M = {}

M.defaults = {
  cmd = { 'memlsp', 'lsp' },
  filetypes = { 'python' },
  root_markers = { 'pyproject.toml', 'setup.py', 'setup.cfg', 'requirements.txt', '.git' },
  settings = { memlsp = { inlayHints = { enable = true } } },
  inlay_hints = true,
}

local function root_dir(bufnr, markers)
  local name = vim.api.nvim_buf_get_name(bufnr)
  local found = vim.fs.find(markers, { path = vim.fs.dirname(name), upward = true })[1]
  if found then
    return vim.fs.dirname(found)
  end
  -- No marker: the file's directory, so the server still has a folder to scan.
  return vim.fs.dirname(name)
end

-- 0.10 has `client.supports_method(m)`, 0.11 `client:supports_method(m)`.
local function supports(client, method)
  if vim.fn.has('nvim-0.11') == 1 then
    return client:supports_method(method)
  end
  return client.supports_method(method)
end

function M.setup(opts)
  local cfg = vim.tbl_deep_extend('force', M.defaults, opts or {})
  M.config = cfg
  local group = vim.api.nvim_create_augroup('memlsp', { clear = true })
  vim.api.nvim_create_autocmd('FileType', {
    group = group,
    pattern = cfg.filetypes,
    callback = function(args)
      if vim.bo[args.buf].buftype ~= '' or vim.api.nvim_buf_get_name(args.buf) == '' then
        return
      end
      vim.lsp.start({
        name = 'memlsp',
        cmd = cfg.cmd,
        root_dir = root_dir(args.buf, cfg.root_markers),
        settings = cfg.settings,
        init_options = cfg.init_options,
        capabilities = cfg.capabilities,
        on_attach = function(client, bufnr)
          if cfg.inlay_hints and vim.lsp.inlay_hint and supports(client, 'textDocument/inlayHint') then
            vim.lsp.inlay_hint.enable(true, { bufnr = bufnr })
          end
          if cfg.on_attach then
            cfg.on_attach(client, bufnr)
          end
        end,
      }, { bufnr = args.buf })
    end,
  })
end

return M
