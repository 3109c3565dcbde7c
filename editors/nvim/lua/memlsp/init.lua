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
--
-- Either way, attached buffers get:
--   :MemlspTimeline [capture]   the memory timeline page (the server renders it; written to a
--                               temporary .html file and opened with vim.ui.open)
--   code lenses "Show memory timeline" on finding lines (`vim.g.memlsp_code_lens = false`: off)
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

-- 0.10 has `client.request(...)`, 0.11 `client:request(...)`.
local function request(client, method, params, handler, bufnr)
  if vim.fn.has('nvim-0.11') == 1 then
    return client:request(method, params, handler, bufnr)
  end
  return client.request(method, params, handler, bufnr)
end

local function is_capture(name)
  return name:match('%.xplane%.pb$') or name:match('%.pickle$') or name:match('%.pkl$')
    or name:match('snapshot[^/]*%.json$')
end

--- The memory timeline page of a capture. `arg`: a capture path, `{capture=…}`, `{file=uri,
--- line=n}` (a code lens's argument) or nil (the current buffer: a capture itself, else the
--- cursor's line). Writes the page the server renders to a temporary file, opens it with
--- `vim.ui.open` and returns nothing; the path is kept in `require('memlsp').last_page`.
function M.timeline(arg)
  local bufnr = vim.api.nvim_get_current_buf()
  local client = vim.lsp.get_clients({ name = 'memlsp' })[1]
  if not client then
    vim.notify('memlsp: the server is not running in this session', vim.log.levels.ERROR)
    return
  end
  if type(arg) == 'string' and arg ~= '' then
    arg = { capture = vim.fn.fnamemodify(arg, ':p') }
  elseif type(arg) ~= 'table' then
    local name = vim.api.nvim_buf_get_name(bufnr)
    if is_capture(name) then
      arg = { capture = name }
    elseif name ~= '' then
      arg = { file = vim.uri_from_fname(name), line = vim.api.nvim_win_get_cursor(0)[1] }
    else
      arg = {}
    end
  end
  local params = { command = 'memlsp.timeline', arguments = { arg } }
  request(client, 'workspace/executeCommand', params, function(err, result)
    if err or type(result) ~= 'table' or type(result.html) ~= 'string' then
      local msg = err and err.message or 'no page'
      vim.notify('memlsp: ' .. msg, vim.log.levels.ERROR)
      return
    end
    local path = vim.fn.tempname() .. '-memlsp-timeline.html'
    local f = io.open(path, 'w')
    if not f then
      vim.notify('memlsp: cannot write ' .. path, vim.log.levels.ERROR)
      return
    end
    f:write(result.html)
    f:close()
    M.last_page = path
    vim.notify('memlsp: memory timeline of ' .. vim.fn.fnamemodify(result.capture, ':t') .. ': ' .. path)
    local ok, e = pcall(vim.ui.open, path)
    if not ok then
      vim.notify('memlsp: cannot open ' .. path .. ' (' .. tostring(e) .. ')', vim.log.levels.WARN)
    end
  end, bufnr)
end

--- Called from on_attach (both config forms): the timeline command, the code lens command and
--- code lens refreshes.
function M.attach(client, bufnr)
  if not M._commands then
    M._commands = true
    vim.api.nvim_create_user_command('MemlspTimeline', function(o)
      M.timeline(o.args ~= '' and o.args or nil)
    end, { nargs = '?', complete = 'file', desc = 'memlsp: show the memory timeline of a capture' })
    vim.lsp.commands['memlsp.showTimeline'] = function(cmd)
      M.timeline(cmd.arguments and cmd.arguments[1] or nil)
    end
  end
  if vim.g.memlsp_code_lens ~= false and vim.lsp.codelens and supports(client, 'textDocument/codeLens') then
    local group = vim.api.nvim_create_augroup('memlsp_codelens_' .. bufnr, { clear = true })
    -- Lenses sit on finding lines: ask again when the findings change (Neovim 0.11 has no
    -- workspace/codeLens/refresh) and when editing pauses.
    vim.api.nvim_create_autocmd({ 'DiagnosticChanged', 'BufEnter', 'InsertLeave', 'BufWritePost' }, {
      group = group,
      buffer = bufnr,
      callback = function()
        vim.lsp.codelens.refresh({ bufnr = bufnr })
      end,
    })
    vim.lsp.codelens.refresh({ bufnr = bufnr })
  end
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
          M.attach(client, bufnr)
          if cfg.on_attach then
            cfg.on_attach(client, bufnr)
          end
        end,
      }, { bufnr = args.buf })
    end,
  })
end

return M
